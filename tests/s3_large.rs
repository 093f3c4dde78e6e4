//! A 5 GiB S3 PUT streams into the engine with bounded memory: curl uploads a body generated
//! on the fly, of a length given up front, to a presigned URL (boto3 signs it); the daemon's
//! peak resident memory stays a small part of the object, and ranged GETs read its bytes back.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

const SIZE: u64 = 5 << 30;
/// The daemon's peak resident memory may grow by this much while it takes the PUT: about a
/// twentieth of the object (the write buffers, stripes in flight and the request pipeline).
const PEAK_GROWTH_KIB_MAX: u64 = 256 << 10;

/// The object's 8 bytes at word `w`: a hash of the index, so any range can be made alone.
fn word(w: u64) -> [u8; 8] {
    let mut z = w.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()
}

/// The object's bytes [offset, offset + len).
fn object_bytes(offset: u64, len: usize) -> Vec<u8> {
    let start = offset / 8 * 8;
    let mut v = Vec::with_capacity(len + 16);
    let mut w = start / 8;
    while (v.len() as u64) < offset - start + len as u64 {
        v.extend_from_slice(&word(w));
        w += 1;
    }
    v[(offset - start) as usize..][..len].to_vec()
}

/// A field of /proc/PID/status in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in {s}"));
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB")
}

#[test]
fn a_5_gib_put_streams_into_the_engine_with_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    // Six 2 GiB drive files: 8 GiB of data with 4+2 parity.
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "2GiB"]);
    let pid = d.child.id();
    let base = format!("http://{}", d.s3);
    let key = format!("{S3_ACCESS}:{S3_SECRET}");
    curl_s3(&key, &["-X", "PUT", &format!("{base}/big")]);
    let presign = Command::new("python3")
        .args([
            "-c",
            "import sys, boto3; from botocore.config import Config
s = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2], aws_secret_access_key=sys.argv[3],
    region_name='us-east-1', config=Config(s3={'addressing_style': 'path'}, signature_version='s3v4'))
print(s.generate_presigned_url('put_object', Params={'Bucket': 'big', 'Key': 'five.bin'}, ExpiresIn=3600))",
            &base,
            S3_ACCESS,
            S3_SECRET,
        ])
        .output()
        .expect("run python3 (with boto3: scripts/deps.sh installs both)");
    assert!(presign.status.success(), "presign: {}", String::from_utf8_lossy(&presign.stderr));
    let url = String::from_utf8(presign.stdout).unwrap().trim().to_string();

    let (hwm_before, rss_before) = (status_kib(pid, "VmHWM"), status_kib(pid, "VmRSS"));
    // The body goes to curl's stdin as it is made; curl sends it with its length and no
    // chunked encoding (the URL's signature covers no headers but Host).
    let mut put = Command::new("curl")
        .args(["-sSf", "-T", "-", "-H", &format!("Content-Length: {SIZE}"), "-H", "Transfer-Encoding:", "-o", "/dev/null", &url])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run curl");
    let mut stdin = put.stdin.take().unwrap();
    let piece = 4 << 20;
    let mut buf = vec![0u8; piece];
    let mut peak_rss = rss_before;
    for i in 0..SIZE / piece as u64 {
        let w0 = i * piece as u64 / 8;
        for (k, c) in buf.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&word(w0 + k as u64));
        }
        stdin.write_all(&buf).expect("feed curl");
        if i % 64 == 0 {
            peak_rss = peak_rss.max(status_kib(pid, "VmRSS"));
        }
    }
    drop(stdin);
    let out = put.wait_with_output().unwrap();
    assert!(out.status.success(), "PUT: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let hwm = status_kib(pid, "VmHWM");
    eprintln!("daemon memory: VmRSS {rss_before} KiB before the PUT, {peak_rss} KiB at most while sampled; VmHWM {hwm_before} KiB before, {hwm} KiB after");
    assert!(
        hwm.saturating_sub(rss_before) < PEAK_GROWTH_KIB_MAX,
        "a {SIZE}-byte PUT raised the daemon's peak memory from {rss_before} KiB (resident before) to {hwm} KiB"
    );

    // The object is whole: its size, and its bytes at the start, across the middle and at the end.
    let head = String::from_utf8(curl_s3(&key, &["-I", &format!("{base}/big/five.bin")])).unwrap().to_ascii_lowercase();
    assert!(head.contains(&format!("content-length: {SIZE}")), "{head}");
    for (offset, len) in [(0u64, 1 << 20), (SIZE / 2 - 333_333, 777_777), (SIZE - (3 << 20) - 5, (3 << 20) + 5)] {
        let got = curl_s3(&key, &["-r", &format!("{offset}-{}", offset + len as u64 - 1), &format!("{base}/big/five.bin")]);
        assert!(got == object_bytes(offset, len), "bytes {offset}..+{len}");
    }
    d.stop();
}
