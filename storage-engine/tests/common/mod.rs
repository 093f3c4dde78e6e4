//! Shared helpers for engine tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use storage_engine::{Caller, Engine, EngineConfig, Stability};

/// Small geometry so that a few hundred KiB span several stripes: 4+2, 16 KiB shards
/// (64 KiB stripes), 4 KiB inline threshold.
pub fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::with_file_drives(dir, 6, 32 << 20, 4, 2);
    c.shard_bytes_max = 16 * 1024;
    c.inline_bytes_max = 4096;
    c.write_buffer_bytes_max = 256 * 1024;
    c.argon2_memory_kib = 64;
    c.admin_password = Some("admin-password".into());
    c.wal_sync_interval_ms = 50;
    c
}

pub fn open(dir: &Path) -> Arc<Engine> {
    Engine::open(config(dir)).expect("open engine")
}

pub fn root() -> Caller {
    Caller::system()
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
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

/// Writes a whole file durably at `path` (parent must exist).
pub fn put(e: &Engine, path: &str, data: &[u8]) -> u64 {
    let c = root();
    let (parent, name) = e.resolve_parent(&c, path).expect("parent");
    let a = e.create(&c, parent.ino, name.as_bytes(), 0o644, false).expect("create");
    e.setattr(&c, a.ino, storage_engine::SetAttr { size: Some(0), ..Default::default() }).expect("truncate");
    e.write(&c, a.ino, 0, data, Stability::Durable).expect("write");
    a.ino
}

pub fn get(e: &Engine, path: &str) -> Vec<u8> {
    let c = root();
    let a = e.resolve(&c, path).expect("resolve");
    e.read(&c, a.ino, 0, a.size as usize + 1).expect("read")
}
