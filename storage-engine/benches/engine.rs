//! Engine throughput against the raw drive files it lives on, measured in one run.
//!
//!     cargo bench -p storage-engine --bench engine --profile dev
//!
//! Environment: AQUIFER_BENCH_DIR (default /var/tmp), AQUIFER_BENCH_FILE_MIB (default 1024),
//! AQUIFER_BENCH_CREATES (default 20000), AQUIFER_BENCH_LOG_REUSE_MIB (metadata log kept for
//! reuse, default 64 as in the daemon: `LOG_REUSE_BYTES_DEFAULT`). Needs `fio` for the raw
//! baseline.

use std::process::Command;
use std::time::Instant;

use storage_engine::{Caller, Engine, EngineConfig, LOG_REUSE_BYTES_DEFAULT, ROOT_INO, Stability};

const DRIVES: usize = 6;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Aggregate MiB/s of fio doing `rw` (write|read) sequentially on every drive file at once,
/// 1 MiB blocks, O_DIRECT, io_uring: the physical limit the engine shares.
fn fio(drives: &[std::path::PathBuf], rw: &str, bytes_per_drive: u64) -> Option<f64> {
    let mut cmd = Command::new("fio");
    cmd.args(["--name=raw", "--ioengine=io_uring", "--direct=1", "--bs=1M", "--iodepth=8", "--group_reporting", "--output-format=terse", "--terse-version=3"]);
    cmd.arg(format!("--rw={rw}"));
    cmd.arg(format!("--size={}", bytes_per_drive));
    cmd.arg("--offset=1M");
    let names: Vec<String> = drives.iter().map(|d| d.display().to_string()).collect();
    cmd.arg(format!("--filename={}", names.join(":")));
    cmd.arg(format!("--numjobs={}", 1));
    cmd.arg("--file_service_type=roundrobin");
    cmd.arg(format!("--nrfiles={}", drives.len()));
    let out = cmd.output().ok()?;
    if !out.status.success() {
        eprintln!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = line.trim().split(';').collect();
    // terse v3: field 6 = read bandwidth KiB/s, field 47 = write bandwidth KiB/s.
    let kib = if rw.contains("read") { f.get(6)? } else { f.get(47)? };
    Some(kib.parse::<f64>().ok()? / 1024.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let base = std::env::var("AQUIFER_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let file_mib = env_u64("AQUIFER_BENCH_FILE_MIB", 1024);
    let creates = env_u64("AQUIFER_BENCH_CREATES", 20_000);
    let dir = tempfile::tempdir_in(&base).expect("bench dir");
    let drive_bytes = ((file_mib << 20) * 2 / 4 + (256 << 20)).next_multiple_of(1 << 20);
    let mut cfg = EngineConfig::with_file_drives(dir.path(), DRIVES, drive_bytes, 4, 2);
    cfg.admin_password = Some("bench-password".into());
    // The engine against its drives: reads reach them, not the data cache.
    cfg.data_cache_bytes = 0;
    // Metadata logs kept for reuse as the daemon keeps them (`[engine] log_reuse_bytes`);
    // AQUIFER_BENCH_LOG_REUSE_MIB=0 for logs that grow as they are written.
    let log_reuse = env_u64("AQUIFER_BENCH_LOG_REUSE_MIB", LOG_REUSE_BYTES_DEFAULT >> 20) << 20;
    cfg.log_reuse_bytes = log_reuse;
    let e = Engine::open(cfg).expect("open engine");
    let c = Caller::system();
    let backend = e.drives()[0].backend.clone();
    println!(
        "# engine benchmark: {DRIVES} file drives x {} MiB in {}, 4+2, backend {backend}, {} MiB of metadata log kept for reuse",
        drive_bytes >> 20,
        dir.path().display(),
        log_reuse >> 20
    );
    println!("idle RSS after open: {} MiB", rss_kib("VmRSS:") >> 10);

    // Large sequential write, 1 MiB application writes, one commit at the end.
    let chunk = pattern(1 << 20, 7);
    let f = e.create(&c, ROOT_INO, b"big", 0o644, true).unwrap();
    let t = Instant::now();
    for i in 0..file_mib {
        e.write(&c, f.ino, i << 20, &chunk, Stability::Unstable).unwrap();
    }
    e.commit(&c, f.ino).unwrap();
    let write_mibs = file_mib as f64 / t.elapsed().as_secs_f64();
    println!("peak RSS after write: {} MiB", rss_kib("VmHWM:") >> 10);

    // Large sequential read, 4 MiB reads; verify a sample.
    let t = Instant::now();
    let mut off = 0u64;
    while off < file_mib << 20 {
        let got = e.read(&c, f.ino, off, 4 << 20).unwrap();
        assert_eq!(got.len(), 4 << 20);
        if off % (64 << 20) == 0 {
            assert!(got[..1 << 20] == chunk[..], "read back differs at {off}");
        }
        off += 4 << 20;
    }
    let read_mibs = file_mib as f64 / t.elapsed().as_secs_f64();

    // Small files: create + 4 KiB write + close. Unstable (metadata log not fsynced per file)
    // and durable (each file fsynced, like an acknowledged REST PUT).
    let d = e.mkdir(&c, ROOT_INO, b"small", 0o755).unwrap();
    let four_k = pattern(4096, 9);
    let mut rates = Vec::new();
    for round in 0..3 {
        let n = creates / 3;
        let t = Instant::now();
        for i in 0..n {
            let a = e.create(&c, d.ino, format!("r{round}-{i}").as_bytes(), 0o644, true).unwrap();
            e.write(&c, a.ino, 0, &four_k, Stability::Unstable).unwrap();
            e.close(&c, a.ino).unwrap();
        }
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    let creates_per_s = median(rates);
    let n_durable = (creates / 20).max(200);
    let t = Instant::now();
    for i in 0..n_durable {
        let a = e.create(&c, d.ino, format!("d{i}").as_bytes(), 0o644, true).unwrap();
        e.write(&c, a.ino, 0, &four_k, Stability::Durable).unwrap();
    }
    let durable_per_s = n_durable as f64 / t.elapsed().as_secs_f64();

    let drive_paths: Vec<_> = e.drives().iter().map(|d| d.path.clone()).collect();
    e.shutdown().unwrap();
    drop(e);

    // Raw baseline on the same files, same bytes the engine moved (data + parity).
    let raw_bytes_per_drive = ((file_mib << 20) * 6 / 4 / DRIVES as u64).next_multiple_of(1 << 20);
    let raw_write = fio(&drive_paths, "write", raw_bytes_per_drive * DRIVES as u64);
    let raw_read = fio(&drive_paths, "read", raw_bytes_per_drive * DRIVES as u64 * 4 / 6);

    println!();
    println!("| measurement | engine | raw drive files (fio, same run) | ratio |");
    println!("|---|--:|--:|--:|");
    match raw_write {
        Some(r) => println!("| sequential write {file_mib} MiB (MiB/s of file data) | {write_mibs:.0} | {r:.0} | {:.2}x |", write_mibs / r),
        None => println!("| sequential write {file_mib} MiB (MiB/s of file data) | {write_mibs:.0} | fio unavailable | - |"),
    }
    match raw_read {
        Some(r) => println!("| sequential read {file_mib} MiB (MiB/s) | {read_mibs:.0} | {r:.0} | {:.2}x |", read_mibs / r),
        None => println!("| sequential read {file_mib} MiB (MiB/s) | {read_mibs:.0} | fio unavailable | - |"),
    }
    println!("| 4 KiB file creates/s (unstable, median of 3 x {}) | {creates_per_s:.0} | | |", creates / 3);
    println!("| 4 KiB file creates/s (each fsynced) | {durable_per_s:.0} | | |");
}
