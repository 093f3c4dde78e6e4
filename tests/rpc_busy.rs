//! `scripts/rpc-busy.py`, which the NFS bench's ceilings are computed with, on captures built
//! here packet by packet: calls and replies split over segments, a reply's first byte captured
//! before its last, and the union of overlapping calls.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const CLIENT: [u8; 4] = [127, 0, 0, 1];
const SERVER_PORT: u16 = 2049;
const CLIENT_PORT: u16 = 40000;
const NFS: u32 = 100_003;

/// A pcap file (microsecond stamps, Ethernet framing as `tcpdump -i lo` writes) of frames.
struct Capture {
    bytes: Vec<u8>,
}

impl Capture {
    fn new() -> Self {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
        bytes.extend_from_slice(&2u16.to_le_bytes());
        bytes.extend_from_slice(&4u16.to_le_bytes());
        bytes.extend_from_slice(&0i32.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&65_535u32.to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        Capture { bytes }
    }

    /// One TCP segment at `micros` (from a whole second), client to server or back.
    fn segment(&mut self, micros: u64, to_server: bool, seq: u32, syn: bool, payload: &[u8]) {
        let (sport, dport) = if to_server { (CLIENT_PORT, SERVER_PORT) } else { (SERVER_PORT, CLIENT_PORT) };
        let mut f = Vec::new();
        f.extend_from_slice(&[0; 12]);
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + 20 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
        f.extend_from_slice(&CLIENT);
        f.extend_from_slice(&CLIENT);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&0u32.to_be_bytes());
        f.push(0x50);
        f.push(if syn { 0x02 } else { 0x18 });
        f.extend_from_slice(&[0xFF, 0xFF, 0, 0, 0, 0]);
        f.extend_from_slice(payload);
        let stamp = 1_000_000_000u64 * 1_000_000 + micros;
        self.bytes.extend_from_slice(&((stamp / 1_000_000) as u32).to_le_bytes());
        self.bytes.extend_from_slice(&((stamp % 1_000_000) as u32).to_le_bytes());
        self.bytes.extend_from_slice(&(f.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&(f.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&f);
    }
}

/// An RPC call record (record mark included) of `body` bytes after the procedure number.
fn call(xid: u32, proc_: u32, body: usize) -> Vec<u8> {
    let mut r = Vec::new();
    for w in [xid, 0, 2, NFS, 3, proc_] {
        r.extend_from_slice(&w.to_be_bytes());
    }
    r.resize(r.len() + body, 0);
    record(r)
}

/// An RPC reply record of `body` bytes after its header.
fn reply(xid: u32, body: usize) -> Vec<u8> {
    let mut r = Vec::new();
    for w in [xid, 1, 0] {
        r.extend_from_slice(&w.to_be_bytes());
    }
    r.resize(r.len() + body, 7);
    record(r)
}

fn record(body: Vec<u8>) -> Vec<u8> {
    let mut r = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    r.extend_from_slice(&body);
    r
}

fn run(cap: &Capture, by_procedure: bool) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cap.pcap");
    std::fs::write(&path, &cap.bytes).expect("write capture");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/rpc-busy.py");
    let mut c = Command::new("python3");
    c.arg(script);
    if by_procedure {
        c.arg("--by-procedure");
    }
    let out = c.arg(&path).arg(SERVER_PORT.to_string()).output().expect("run python3");
    assert!(out.status.success(), "rpc-busy.py: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

/// Two READs one after the other, each reply in two segments 1.5 ms and 0.5 ms apart from
/// its first byte, then a GETATTR whose call arrives in two segments while the second READ
/// is outstanding.
fn capture() -> Capture {
    let mut cap = Capture::new();
    let (mut cseq, mut sseq) = (1000u32, 5000u32);
    cap.segment(0, true, cseq - 1, true, &[]);
    cap.segment(10, false, sseq - 1, true, &[]);

    // READ 1: call at 1,000 µs, reply begins at 1,500, ends at 3,000.
    let c1 = call(1, 6, 16);
    cap.segment(1000, true, cseq, false, &c1);
    cseq += c1.len() as u32;
    let r1 = reply(1, 4000);
    cap.segment(1500, false, sseq, false, &r1[..100]);
    cap.segment(3000, false, sseq + 100, false, &r1[100..]);
    sseq += r1.len() as u32;

    // READ 2: call at 10,000 µs, reply from 10,200 to 10,700.
    let c2 = call(2, 6, 16);
    cap.segment(10_000, true, cseq, false, &c2);
    cseq += c2.len() as u32;
    // GETATTR: its call's first half at 10,050, the rest at 10,100; reply at 10,150.
    let c3 = call(3, 1, 40);
    cap.segment(10_050, true, cseq, false, &c3[..30]);
    cap.segment(10_100, true, cseq + 30, false, &c3[30..]);
    let r3 = reply(3, 20);
    cap.segment(10_150, false, sseq, false, &r3);
    sseq += r3.len() as u32;
    let r2 = reply(2, 4000);
    cap.segment(10_200, false, sseq, false, &r2[..2000]);
    cap.segment(10_700, false, sseq + 2000, false, &r2[2000..]);
    cap
}

#[test]
fn busy_and_answering_time_from_a_capture() {
    let v = run(&capture(), false);
    assert_eq!(v["calls"], 3, "{v}");
    assert_eq!(v["replies"], 3, "{v}");
    assert_eq!(v["lost"], 0, "{v}");
    // Outstanding: 1,000–3,000 and 10,000–10,700 (the GETATTR's 10,100–10,150 inside it).
    assert!(close(&v["busy_s"], 0.0027), "{v}");
    // Before the replies began: 1,000–1,500 and 10,000–10,200.
    assert!(close(&v["answer_s"], 0.0007), "{v}");
    // From the first call's first byte to the last reply's last byte.
    assert!(close(&v["span_s"], 0.0097), "{v}");
}

#[test]
fn per_procedure_times_from_a_capture() {
    let v = run(&capture(), true);
    let read = &v["procedures"]["100003/6"];
    assert_eq!(read[0], 2, "{v}");
    assert!(close(&read[1], 0.00135), "median outstanding: {v}");
    assert!(close(&read[2], 0.0027), "total outstanding: {v}");
    assert!(close(&read[3], 0.00035), "median before the reply: {v}");
    let getattr = &v["procedures"]["100003/1"];
    assert_eq!(getattr[0], 1, "{v}");
    assert!(close(&getattr[1], 0.00005) && close(&getattr[3], 0.00005), "{v}");
}
