//! Model-based test: random operation sequences against the engine and against a BTreeMap,
//! with drive write failures injected and crash/restart points. A failure prints its seed;
//! `AQUIFER_MODEL_SEED=N` replays it, `AQUIFER_MODEL_SEEDS=K` runs more seeds.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use hardware::{BlockDevice, FaultControl, FaultyDrive};
use parking_lot::Mutex;
use storage_engine::*;

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Dir,
    File(Vec<u8>),
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const PATHS: &[&str] = &["/a", "/b", "/a/x", "/a/y", "/b/x", "/b/z", "/a/x/q"];

fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) => "/",
        Some(i) => &p[..i],
        None => "/",
    }
}

/// Fields drop in order: the engine closes before its directory is removed.
struct Harness {
    engine: Option<Arc<Engine>>,
    faults: Arc<Mutex<Vec<FaultControl>>>,
    dir: tempfile::TempDir,
}

impl Harness {
    fn open(&mut self) {
        self.faults.lock().clear();
        let mut cfg = config(self.dir.path());
        let faults = self.faults.clone();
        cfg.drive_wrapper = Some(Arc::new(move |_i, dev: Arc<dyn BlockDevice>| {
            let (d, c) = FaultyDrive::new(dev);
            faults.lock().push(c);
            Arc::new(d) as Arc<dyn BlockDevice>
        }));
        self.engine = Some(Engine::open(cfg).expect("reopen engine"));
    }
    fn e(&self) -> &Engine {
        self.engine.as_ref().unwrap()
    }
}

fn exists_dir(model: &BTreeMap<String, Node>, p: &str) -> bool {
    p == "/" || model.get(p) == Some(&Node::Dir)
}

fn verify(h: &Harness, model: &BTreeMap<String, Node>, seed: u64, step: usize) {
    let c = root();
    let e = h.e();
    // Every model entry exists with the right content...
    for (p, n) in model {
        let a = e.resolve(&c, p).unwrap_or_else(|err| panic!("seed {seed} step {step}: {p} missing: {err}"));
        match n {
            Node::Dir => assert_eq!(a.kind, FileKind::Dir, "seed {seed} step {step}: {p}"),
            Node::File(d) => {
                assert_eq!(a.size, d.len() as u64, "seed {seed} step {step}: size of {p}");
                let got = e.read(&c, a.ino, 0, d.len() + 10).unwrap();
                assert!(got == *d, "seed {seed} step {step}: content of {p} differs");
            }
        }
    }
    // ...and nothing else does.
    let mut stack = vec![("/".to_string(), ROOT_INO)];
    let mut count = 0;
    while let Some((p, ino)) = stack.pop() {
        for ent in e.readdir(&c, ino, None, 1000).unwrap().entries {
            let child = if p == "/" { format!("/{}", String::from_utf8_lossy(&ent.name)) } else { format!("{p}/{}", String::from_utf8_lossy(&ent.name)) };
            assert!(model.contains_key(&child), "seed {seed} step {step}: unexpected {child}");
            count += 1;
            if ent.kind == FileKind::Dir {
                stack.push((child, ent.ino));
            }
        }
    }
    assert_eq!(count, model.len(), "seed {seed} step {step}");
}

fn run(seed: u64, steps: usize) {
    let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    let mut h = Harness { engine: None, faults: Arc::new(Mutex::new(Vec::new())), dir: tempfile::tempdir().unwrap() };
    h.open();
    let mut model: BTreeMap<String, Node> = BTreeMap::new();
    let c = root();
    for step in 0..steps {
        let p = PATHS[rng.below(PATHS.len() as u64) as usize];
        let op = rng.below(100);
        // Faults last one step; cleared here because some steps end with `continue`.
        for f in h.faults.lock().iter() {
            f.clear();
        }
        let faulty = rng.below(8) == 0;
        if faulty {
            let d = rng.below(6) as usize;
            let n = rng.below(3);
            h.faults.lock()[d].fail_writes_after(Some(n));
        }
        let e = h.e();
        if std::env::var("AQUIFER_MODEL_TRACE").is_ok() {
            eprintln!("step {step}: op {op} path {p} faulty {faulty}");
        }
        match op {
            0..=14 => {
                let ok = exists_dir(&model, parent(p)) && !model.contains_key(p);
                let r = e.resolve_parent(&c, p).and_then(|(par, name)| e.create(&c, par.ino, name.as_bytes(), 0o644, true));
                assert_eq!(r.is_ok(), ok, "seed {seed} step {step}: create {p}: {r:?}");
                if ok {
                    model.insert(p.to_string(), Node::File(Vec::new()));
                }
            }
            15..=24 => {
                let ok = exists_dir(&model, parent(p)) && !model.contains_key(p);
                let r = e.resolve_parent(&c, p).and_then(|(par, name)| e.mkdir(&c, par.ino, name.as_bytes(), 0o755));
                assert_eq!(r.is_ok(), ok, "seed {seed} step {step}: mkdir {p}: {r:?}");
                if ok {
                    model.insert(p.to_string(), Node::Dir);
                }
            }
            25..=54 => {
                if let Some(Node::File(old)) = model.get(p).cloned() {
                    let off = [0, 1, 4095, 4096, 50_000, 65_536, 130_000][rng.below(7) as usize] + rng.below(3);
                    let len = [1, 100, 4096, 20_000, 65_536, 200_000][rng.below(6) as usize] as usize;
                    let data = bytes(rng.next(), len);
                    let a = e.resolve(&c, p).unwrap();
                    let durable = rng.below(2) == 0;
                    let r = e
                        .write(&c, a.ino, off, &data, if durable { Stability::Durable } else { Stability::Unstable })
                        .and_then(|_| e.close(&c, a.ino));
                    match r {
                        Ok(()) => {
                            if std::env::var("AQUIFER_MODEL_TRACE").is_ok() {
                                eprintln!("  write {p} off {off} len {len} durable {durable}");
                            }
                            let mut new = old.clone();
                            let end = off as usize + len;
                            if new.len() < end {
                                new.resize(end, 0);
                            }
                            new[off as usize..end].copy_from_slice(&data);
                            model.insert(p.to_string(), Node::File(new));
                        }
                        Err(err) => {
                            if std::env::var("AQUIFER_MODEL_TRACE").is_ok() {
                                eprintln!("  write {p} off {off} len {len} failed: {err}");
                            }
                            assert!(faulty, "seed {seed} step {step}: write failed without a fault: {err}")
                        }
                    }
                }
            }
            55..=64 => {
                if let Some(Node::File(mut old)) = model.get(p).cloned() {
                    let size = [0, 10, 4096, 70_000, 300_000][rng.below(5) as usize];
                    let a = e.resolve(&c, p).unwrap();
                    let r = e.setattr(&c, a.ino, SetAttr { size: Some(size), ..Default::default() });
                    match r {
                        Ok(_) => {
                            old.resize(size as usize, 0);
                            model.insert(p.to_string(), Node::File(old));
                        }
                        Err(err) => assert!(faulty, "seed {seed} step {step}: truncate failed without a fault: {err}"),
                    }
                }
            }
            65..=77 => {
                let node = model.get(p).cloned();
                let (par, name) = match e.resolve_parent(&c, p) {
                    Ok(x) => x,
                    Err(_) => {
                        assert!(!exists_dir(&model, parent(p)));
                        continue;
                    }
                };
                match node {
                    Some(Node::File(_)) => {
                        e.unlink(&c, par.ino, name.as_bytes()).unwrap();
                        model.remove(p);
                    }
                    Some(Node::Dir) => {
                        let empty = !model.keys().any(|k| k.starts_with(&format!("{p}/")));
                        let r = e.rmdir(&c, par.ino, name.as_bytes());
                        assert_eq!(r.is_ok(), empty, "seed {seed} step {step}: rmdir {p}: {r:?}");
                        if empty {
                            model.remove(p);
                        }
                    }
                    None => assert!(e.unlink(&c, par.ino, name.as_bytes()).is_err()),
                }
            }
            78..=89 => {
                let q = PATHS[rng.below(PATHS.len() as u64) as usize];
                if let (Some(Node::File(d)), true) = (model.get(p).cloned(), exists_dir(&model, parent(q))) {
                    if matches!(model.get(q), None | Some(Node::File(_))) {
                        let (fp, fname) = e.resolve_parent(&c, p).unwrap();
                        let (tp, tname) = e.resolve_parent(&c, q).unwrap();
                        e.rename(&c, fp.ino, fname.as_bytes(), tp.ino, tname.as_bytes()).unwrap();
                        model.remove(p);
                        model.insert(q.to_string(), Node::File(d));
                    }
                }
            }
            _ => {
                // Crash: drop the engine without shutdown, then reopen without faults.
                // Every operation above returned only after its data was committed.
                h.engine = None;
                h.open();
            }
        }
        for f in h.faults.lock().iter() {
            f.clear();
        }
        if step % 7 == 0 || op >= 90 {
            verify(&h, &model, seed, step);
        }
    }
    verify(&h, &model, seed, steps);
    // Remove everything: every stripe must come back to the allocators.
    let paths: Vec<String> = model.keys().rev().cloned().collect();
    for p in paths {
        let e = h.e();
        let (par, name) = e.resolve_parent(&c, &p).unwrap();
        match model[&p] {
            Node::Dir => e.rmdir(&c, par.ino, name.as_bytes()).unwrap(),
            Node::File(_) => e.unlink(&c, par.ino, name.as_bytes()).unwrap(),
        }
    }
    h.e().sync_metadata().unwrap();
    let used: Vec<u64> = h.e().drives().iter().map(|d| d.used_bytes).collect();
    assert!(used.iter().all(|u| *u == 0), "seed {seed}: space leaked: {used:?}");
    h.engine = None;
    h.open();
    assert!(h.e().drives().iter().all(|d| d.used_bytes == 0), "seed {seed}: space leaked after restart");
}

#[test]
fn random_operations_match_the_model() {
    if let Ok(s) = std::env::var("AQUIFER_MODEL_SEED") {
        run(s.parse().expect("seed is a number"), 400);
        return;
    }
    let seeds: u64 = std::env::var("AQUIFER_MODEL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(6);
    for seed in 1..=seeds {
        run(seed, 250);
    }
}
