//! `aquifer bench dataset` / `aquifer bench train` against a real daemon, through the REST file
//! API and S3, directly and through `aquifer wan-emulator`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{ADMIN_PASSWORD, Daemon, S3_ACCESS, S3_SECRET, bin};
use serde_json::Value;

/// `aquifer ARGS` with the daemon's credentials in the environment (and no stray AWS ones).
fn aquifer(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("AQUIFER_PASSWORD", ADMIN_PASSWORD)
        .env("AQUIFER_S3_ACCESS_KEY", S3_ACCESS)
        .env("AQUIFER_S3_SECRET_KEY", S3_SECRET)
        .env_remove("AQUIFER_TOKEN")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY");
    c
}

fn ok(out: Output, what: &str) -> (Value, Vec<String>) {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{what}: {}\nstdout: {stdout}\nstderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    let last = lines.last().unwrap_or_else(|| panic!("{what}: no output"));
    let json = serde_json::from_str(last).unwrap_or_else(|e| panic!("{what}: last line is not JSON ({e}): {last}"));
    (json, lines)
}

fn failed(out: Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} should fail; stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn check_train(j: &Value, batches: u64, samples: u64, sample_bytes: u64) {
    assert_eq!(j["benchmark"], "train");
    assert_eq!(j["batches"], batches, "{j}");
    assert_eq!(j["samples"], samples, "{j}");
    assert_eq!(j["bytes"], samples * sample_bytes, "{j}");
    assert_eq!(j["verified_bytes"], samples * sample_bytes, "every byte compared with the seeded content: {j}");
    let au = j["accelerator_utilization"].as_f64().unwrap();
    assert!(au > 0.0 && au <= 1.0, "utilization {au}");
    assert!(j["throughput_samples_per_s"].as_f64().unwrap() > 0.0);
    assert!(j["throughput_mib_per_s"].as_f64().unwrap() > 0.0);
    let (median, p99, max) = (j["stall_ms"]["median"].as_f64().unwrap(), j["stall_ms"]["p99"].as_f64().unwrap(), j["stall_ms"]["max"].as_f64().unwrap());
    assert!(0.0 <= median && median <= p99 && p99 <= max, "{j}");
    // Warm-up is a batch count within the run, or null when the stall never settled.
    assert!(j["warmup_batches"].is_null() || j["warmup_batches"].as_u64().unwrap() <= batches, "{j}");
}

#[test]
fn datasets_and_training_reads_over_rest_and_s3() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB"]);

    // One dataset per layout, same seed: sample i has the same bytes in both.
    let (j, _) = ok(
        aquifer(&["bench", "dataset", "--rest", &d.rest, "--path", "/train/small", "--layout", "small", "--count", "40", "--sample-bytes", "20KiB", "--seed", "5"]).output().unwrap(),
        "dataset small",
    );
    assert_eq!((j["files"].as_u64(), j["bytes"].as_u64()), (Some(40), Some(40 * 20 * 1024)), "{j}");
    let (j, _) = ok(
        aquifer(&[
            "bench", "dataset", "--s3", &d.s3, "--path", "trainbkt/shards", "--layout", "shard", "--count", "40", "--sample-bytes", "20KiB",
            "--shard-bytes", "128KiB", "--seed", "5",
        ])
        .output()
        .unwrap(),
        "dataset shard",
    );
    // 20 KiB samples as tar members of 512 + 20480 bytes: 6 to a 128 KiB shard, 7 shards.
    assert_eq!(j["files"], 7, "{j}");

    // The shards are real tar files: GNU tar lists them and extracts sample 13 with the same
    // bytes as the small layout's sample 13.
    let http = d.client();
    let shard = http.get(d.url("/api/v1/files/trainbkt/shards/shard-000002.tar")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert!(shard.status().is_success());
    let shard_path = dir.path().join("shard.tar");
    std::fs::write(&shard_path, shard.bytes().unwrap()).unwrap();
    let listing = Command::new("tar").arg("-tf").arg(&shard_path).output().expect("run tar");
    assert!(listing.status.success(), "tar -tf: {}", String::from_utf8_lossy(&listing.stderr));
    let names: Vec<String> = String::from_utf8_lossy(&listing.stdout).lines().map(str::to_string).collect();
    assert_eq!(names, (12..18).map(|i| format!("sample-{i:08}.bin")).collect::<Vec<_>>());
    let member = Command::new("tar").arg("-xOf").arg(&shard_path).arg("sample-00000013.bin").output().unwrap();
    let small = http.get(d.url("/api/v1/files/train/small/sample-00000013.bin")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().bytes().unwrap();
    assert_eq!(member.stdout.len(), 20 * 1024);
    assert!(member.stdout == small.as_ref(), "sample 13 differs between the layouts");

    // Shuffled small samples through REST, two epochs cut short at 15 batches of 4.
    let (j, lines) = ok(
        aquifer(&[
            "bench", "train", "--via", "rest", "--endpoint", &d.rest, "--path", "/train/small", "--workers", "3", "--batch", "4", "--compute-ms", "5",
            "--epochs", "2", "--shuffle", "--seed", "3", "--batches", "15",
        ])
        .output()
        .unwrap(),
        "train rest small",
    );
    check_train(&j, 15, 60, 20 * 1024);
    assert_eq!(lines.iter().filter(|l| l.starts_with("batch ")).count(), 15, "one line per batch");
    assert!(lines[0].contains("stall_ms"));

    // Shards streamed through S3 range reads, credentials from a key file.
    let key_file = dir.path().join("s3-credentials");
    std::fs::write(&key_file, format!("AWS_ACCESS_KEY_ID={S3_ACCESS}\nAWS_SECRET_ACCESS_KEY={S3_SECRET}\n")).unwrap();
    let mut cmd = aquifer(&[
        "bench", "train", "--via", "s3", "--endpoint", &d.s3, "--path", "trainbkt/shards", "--layout", "shard", "--workers", "2", "--batch", "8",
        "--compute-ms", "5", "--quiet", "--s3-credentials", key_file.to_str().unwrap(),
    ]);
    cmd.env_remove("AQUIFER_S3_ACCESS_KEY").env_remove("AQUIFER_S3_SECRET_KEY");
    let (j, lines) = ok(cmd.output().unwrap(), "train s3 shard");
    // Worker 0 streams shards 0, 2, 4, 6 (22 samples: 3 batches), worker 1 shards 1, 3, 5 (18: 3).
    check_train(&j, 6, 40, 20 * 1024);
    assert_eq!(j["via"], "s3");
    assert_eq!(lines.len(), 1, "--quiet prints only the result");

    // The small layout through S3 too (whole-object GETs).
    let (j, _) = ok(
        aquifer(&["bench", "train", "--via", "s3", "--endpoint", &d.s3, "--path", "train/small", "--batch", "10", "--compute-ms", "1", "--quiet"]).output().unwrap(),
        "train s3 small",
    );
    check_train(&j, 4, 40, 20 * 1024);

    // Bad input: clear errors, not panics.
    let e = failed(aquifer(&["bench", "train", "--via", "rest", "--endpoint", &d.rest, "--path", "/train/small", "--layout", "shard"]).output().unwrap(), "wrong layout");
    assert!(e.contains("layout"), "{e}");
    let e = failed(aquifer(&["bench", "train", "--via", "rest", "--endpoint", &d.rest, "--path", "/train/nothing"]).output().unwrap(), "no dataset");
    assert!(e.contains("manifest") && e.contains("404"), "{e}");
    let mut wrong = aquifer(&["bench", "train", "--via", "s3", "--endpoint", &d.s3, "--path", "trainbkt/shards"]);
    wrong.env("AQUIFER_S3_SECRET_KEY", "not-the-secret");
    let e = failed(wrong.output().unwrap(), "wrong S3 secret");
    assert!(e.contains("403"), "{e}");
    let e = failed(aquifer(&["bench", "train", "--via", "rest", "--endpoint", &d.rest, "--path", "/train/small", "--compute-ms", "0"]).output().unwrap(), "compute 0");
    assert!(e.contains("--compute-ms"), "{e}");
    let e = failed(aquifer(&["bench", "dataset", "--rest", &d.rest, "--path", "/x", "--layout", "shard", "--count", "3", "--sample-bytes", "1MiB", "--shard-bytes", "64KiB"]).output().unwrap(), "shard too small");
    assert!(e.contains("shard size"), "{e}");

    // A sample changed behind the benchmark's back is caught by the verification.
    let res = http
        .put(d.url("/api/v1/files/train/small/sample-00000007.bin"))
        .basic_auth("admin", Some(ADMIN_PASSWORD))
        .body(vec![7u8; 20 * 1024])
        .send()
        .unwrap();
    assert!(res.status().is_success());
    let e = failed(aquifer(&["bench", "train", "--via", "rest", "--endpoint", &d.rest, "--path", "/train/small", "--batch", "40", "--compute-ms", "1"]).output().unwrap(), "corrupt sample");
    assert!(e.contains("sample 7") && e.contains("differs"), "{e}");

    d.stop();
}

#[test]
fn training_reads_through_the_wan_emulator() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB"]);
    ok(
        aquifer(&["bench", "dataset", "--rest", &d.rest, "--path", "/wan/shards", "--layout", "shard", "--count", "24", "--sample-bytes", "8KiB", "--shard-bytes", "64KiB"]).output().unwrap(),
        "dataset",
    );

    let mut emu = aquifer(&["wan-emulator", "--listen", "127.0.0.1:0", "--target", &d.rest, "--delay-ms", "15", "--bandwidth-mbit", "200", "--control", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(emu.stdout.take().unwrap()).read_line(&mut first).unwrap();
    // "WAN emulator at 127.0.0.1:P -> ... control 127.0.0.1:C)"
    let addr = first.split_whitespace().nth(3).unwrap().to_string();
    let control = first.rsplit("control ").next().unwrap().trim_end_matches([')', '\n']).to_string();
    assert!(first.starts_with("WAN emulator at") && addr.contains(':') && control.contains(':'), "{first}");

    let (j, lines) = ok(
        aquifer(&["bench", "train", "--via", "rest", "--endpoint", &addr, "--path", "/wan/shards", "--workers", "2", "--batch", "4", "--compute-ms", "10"]).output().unwrap(),
        "train through the emulator",
    );
    // 7 samples to a 64 KiB shard: worker 0 streams shards 0 and 2 (14 samples: 4 batches),
    // worker 1 shards 1 and 3 (10: 3).
    check_train(&j, 7, 24, 8 * 1024);
    // Each sample is one request; a worker waits at least one 30 ms round trip per sample, so the
    // first batch (4 samples) cannot arrive sooner than 4 round trips.
    let first_stall: f64 = lines[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(first_stall >= 120.0, "first batch stall {first_stall} ms through a 30 ms round trip");

    // The control port saw the traffic and can cut the link: the benchmark then fails clearly.
    let mut ctl = std::net::TcpStream::connect(&control).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut ask = |cmd: &str| -> String {
        use std::io::Write;
        writeln!(ctl, "{cmd}").unwrap();
        let mut line = String::new();
        BufReader::new(ctl.try_clone().unwrap()).read_line(&mut line).unwrap();
        line
    };
    let status: Value = serde_json::from_str(ask("status").strip_prefix("ok ").unwrap()).unwrap();
    assert!(status["bytes_down"].as_u64().unwrap() >= 24 * 8 * 1024, "{status}");
    assert_eq!(ask("cut").trim(), "ok cut");
    let e = failed(aquifer(&["bench", "train", "--via", "rest", "--endpoint", &addr, "--path", "/wan/shards"]).output().unwrap(), "train over a cut link");
    assert!(e.contains("manifest"), "{e}");
    assert_eq!(ask("restore").trim(), "ok restored");
    ok(
        aquifer(&["bench", "train", "--via", "rest", "--endpoint", &addr, "--path", "/wan/shards", "--batches", "2", "--compute-ms", "1", "--quiet"]).output().unwrap(),
        "train after restore",
    );

    let _ = emu.kill();
    let _ = emu.wait();
    d.stop();
}
