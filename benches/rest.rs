//! The daemon through its REST file API, against the raw drive files in the same run, and
//! the daemon's memory.
//!
//!     cargo bench --bench rest --profile dev
//!
//! Environment: AQUIFER_BENCH_DIR (default /var/tmp), AQUIFER_BENCH_FILE_MIB (default 1024),
//! AQUIFER_BENCH_SECONDS (small-file phase, default 10). Needs `fio` for the raw baseline.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PASSWORD: &str = "bench-admin-password";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn fio(files: &[String], rw: &str, total: u64) -> Option<f64> {
    let out = Command::new("fio")
        .args(["--name=raw", "--ioengine=io_uring", "--direct=1", "--bs=1M", "--iodepth=8", "--output-format=terse", "--terse-version=3", "--offset=1M", "--file_service_type=roundrobin"])
        .arg(format!("--rw={rw}"))
        .arg(format!("--size={total}"))
        .arg(format!("--nrfiles={}", files.len()))
        .arg(format!("--filename={}", files.join(":")))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = s.trim().split(';').collect();
    let kib: f64 = if rw == "read" { f.get(6)?.parse().ok()? } else { f.get(47)?.parse().ok()? };
    Some(kib / 1024.0)
}

fn main() {
    let base = std::env::var("AQUIFER_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let file_mib = env_u64("AQUIFER_BENCH_FILE_MIB", 1024);
    let seconds = env_u64("AQUIFER_BENCH_SECONDS", 10);
    let dir = tempfile::tempdir_in(&base).expect("bench dir");
    let drive_mib = file_mib / 2 + 512;
    let mut child = Command::new(env!("CARGO_BIN_EXE_aquifer"))
        .args(["serve", "--rest", "127.0.0.1:0", "--s3", "127.0.0.1:0", "--nfs", "127.0.0.1:0", "--sftp", "127.0.0.1:0", "--drive-size"])
        .arg(format!("{drive_mib}MiB"))
        .arg("--data-dir")
        .arg(dir.path())
        .env("AQUIFER_ADMIN_PASSWORD", PASSWORD)
        .env("AQUIFER_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start aquifer serve");
    let pid = child.id();
    let mut addr = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let (true, Some(i)) = (line.starts_with("Aquifer is serving"), line.find("http://")) {
            addr = line[i + 7..].chars().take_while(|c| *c != '/').collect();
            break;
        }
    }
    let url = |p: &str| format!("http://{addr}/api/v1{p}");
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = proc_kib(pid, "VmRSS:");

    // The large transfers use curl, a client fast enough not to be the bottleneck.
    let src = dir.path().join("source.bin");
    {
        use std::io::Write;
        let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut f = std::fs::File::create(&src).unwrap();
        for _ in 0..file_mib {
            f.write_all(&block).unwrap();
        }
    }
    let curl = |args: &[&str]| -> f64 {
        let out = Command::new("curl")
            .args(["-s", "-S", "-f", "-o", "/dev/null", "-u", &format!("admin:{PASSWORD}")])
            .args(args)
            .output()
            .expect("run curl");
        assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().expect("curl speed") / (1 << 20) as f64
    };
    let put_mibs = curl(&["-w", "%{speed_upload}", "-T", src.to_str().unwrap(), &url("/files/bench/big.bin")]);
    let peak_rss_write = proc_kib(pid, "VmHWM:");
    let get_mibs = curl(&["-w", "%{speed_download}", &url("/files/bench/big.bin")]);
    let _ = std::fs::remove_file(&src);

    // 4 KiB PUTs from 8 concurrent clients.
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut threads = Vec::new();
    for w in 0..8 {
        let count = count.clone();
        let u = url("");
        threads.push(std::thread::spawn(move || {
            let c = reqwest::blocking::Client::new();
            let body = vec![7u8; 4096];
            let mut i = 0;
            while Instant::now() < deadline {
                let r = c.put(format!("{u}/files/small/w{w}/f{i}")).basic_auth("admin", Some(PASSWORD)).body(body.clone()).send().unwrap();
                assert!(r.status().is_success());
                i += 1;
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let small_per_s = count.load(Ordering::Relaxed) as f64 / seconds as f64;
    let peak_rss = proc_kib(pid, "VmHWM:");

    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
    let drives: Vec<String> = (0..6).map(|i| dir.path().join(format!("drives/drive-{i}.img")).display().to_string()).collect();
    let raw_w = fio(&drives, "write", (file_mib << 20) * 6 / 4);
    let raw_r = fio(&drives, "read", file_mib << 20);

    println!("| measurement | REST | raw drive files (fio, same run) | ratio |");
    println!("|---|--:|--:|--:|");
    let row = |name: &str, v: f64, raw: Option<f64>| match raw {
        Some(r) => println!("| {name} | {v:.0} | {r:.0} | {:.2}x |", v / r),
        None => println!("| {name} | {v:.0} | fio unavailable | - |"),
    };
    row(&format!("PUT {file_mib} MiB file (MiB/s)"), put_mibs, raw_w);
    row(&format!("GET {file_mib} MiB file (MiB/s)"), get_mibs, raw_r);
    println!("| 4 KiB PUTs/s, 8 clients, each durable | {small_per_s:.0} | | |");
    println!("| daemon RSS idle / peak after large PUT / peak overall (MiB) | {} / {} / {} | | |", idle_rss >> 10, peak_rss_write >> 10, peak_rss >> 10);
}
