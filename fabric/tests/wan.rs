//! The WAN emulator against real TCP peers on loopback: delay, pipelining, bandwidth cap,
//! cut/restore, the control port, and bounded buffering.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fabric::wan::{WanConfig, WanEmulator};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const MIB: usize = 1024 * 1024;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
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

/// An echo server: every byte read is written back; returns its address.
async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A server that accepts connections and never reads from them.
async fn stalled_server() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let _ = tx.send(c);
        }
    });
    (addr, rx)
}

async fn emulator(target: SocketAddr, delay_ms: u64, bandwidth: Option<u64>) -> WanEmulator {
    let mut cfg = WanConfig::new("127.0.0.1:0".parse().unwrap(), target);
    cfg.delay = Duration::from_millis(delay_ms);
    cfg.bandwidth_bytes_per_s = bandwidth;
    WanEmulator::start(cfg).await.unwrap()
}

/// Sends `data` through an echo path and checks that exactly the same bytes come back.
async fn echo_exact(addr: SocketAddr, data: &[u8]) -> Duration {
    let t0 = Instant::now();
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let send = data.to_vec();
    let writer = tokio::spawn(async move {
        w.write_all(&send).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::with_capacity(data.len());
    r.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    assert_eq!(back.len(), data.len(), "bytes back through the emulator");
    assert!(back == data, "bytes changed through the emulator");
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_is_twice_the_one_way_delay() {
    let emu = emulator(echo_server().await, 25, None).await;
    let mut s = TcpStream::connect(emu.local_addr()).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut rtts = Vec::new();
    for i in 0..8u8 {
        let t0 = Instant::now();
        s.write_all(&[i]).await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        rtts.push(t0.elapsed());
        assert_eq!(b[0], i);
    }
    rtts.sort();
    assert!(rtts[0] >= Duration::from_millis(50), "an RTT below 2 × 25 ms: {rtts:?}");
    // Generous: the point is that the delay is not applied many times over.
    assert!(rtts[rtts.len() / 2] < Duration::from_millis(400), "median RTT {rtts:?}");

    // Changing the delay applies to bytes read from then on.
    emu.set_delay(Duration::from_millis(5));
    let t0 = Instant::now();
    s.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    let rtt = t0.elapsed();
    assert!(rtt >= Duration::from_millis(10), "{rtt:?}");
    assert!(rtt < Duration::from_millis(50), "a 5 ms delay must not still cost the old 50 ms round trip: {rtt:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_is_pipelined_not_serialised() {
    let emu = emulator(echo_server().await, 50, None).await;
    let data = pattern(1, 8 * MIB);
    let took = echo_exact(emu.local_addr(), &data).await;
    // One 64 KiB chunk per 100 ms round trip would take 128 × 100 ms = 12.8 s.
    let serialised = Duration::from_millis(100) * (8 * MIB / (64 * 1024)) as u32;
    assert!(took >= Duration::from_millis(100), "an echo through a 50 ms delay cannot be faster than one RTT: {took:?}");
    eprintln!("8 MiB echoed through 50 ms each way: {took:?}");
    assert!(took < serialised / 4, "8 MiB through a 50 ms delay took {took:?}; serialised it would take {serialised:?}");
    let st = emu.stats();
    assert_eq!(st.bytes_up, data.len() as u64);
    assert_eq!(st.bytes_down, data.len() as u64);
    assert_eq!(st.bytes_in_flight_up + st.bytes_in_flight_down, 0);
}

/// A sink that reads everything and answers with the byte count once the sender half-closes.
async fn counting_sink() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut n = 0u64;
                loop {
                    match c.read(&mut buf).await {
                        Ok(0) => break,
                        Ok(k) => n += k as u64,
                        Err(_) => return,
                    }
                }
                let _ = c.write_all(&n.to_le_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_60ms_gigabit_link_carries_far_more_than_one_chunk_per_round_trip() {
    let cap: u64 = 125_000_000; // 1 Gbit/s
    let emu = emulator(counting_sink().await, 30, Some(cap)).await;
    let total = 96 * MIB;
    let chunk = pattern(9, MIB);
    let t0 = Instant::now();
    let mut s = TcpStream::connect(emu.local_addr()).await.unwrap();
    for _ in 0..total / MIB {
        s.write_all(&chunk).await.unwrap();
    }
    s.shutdown().await.unwrap();
    let mut n = [0u8; 8];
    s.read_exact(&mut n).await.unwrap();
    let took = t0.elapsed();
    assert_eq!(u64::from_le_bytes(n), total as u64, "bytes counted at the far end");
    // Minus the 60 ms of delay the transfer itself cannot avoid (data out, count back).
    let rate = total as f64 / (took.as_secs_f64() - 0.06).max(1e-3);
    eprintln!("{} MiB through 30 ms each way with a 1 Gbit/s cap: {took:?}, {:.0} Mbit/s", total / MIB, rate * 8.0 / 1e6);
    assert!(rate <= cap as f64 * 1.1, "{rate:.0} B/s over the cap");
    // One 64 KiB chunk per 60 ms round trip would be ~1 MiB/s; demand a quarter of the cap.
    assert!(rate >= cap as f64 / 4.0, "{rate:.0} B/s: the delay line is not pipelining");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bandwidth_cap_is_shared_by_all_connections() {
    let cap: u64 = 4_000_000; // bytes/s per direction
    let emu = emulator(echo_server().await, 1, Some(cap)).await;
    let addr = emu.local_addr();
    let t0 = Instant::now();
    let a = pattern(2, 3_000_000);
    let b = pattern(3, 3_000_000);
    let (ra, rb) = tokio::join!(echo_exact(addr, &a), echo_exact(addr, &b));
    let took = t0.elapsed();
    // 6 MB each way through a 4 MB/s cap: at least ~1.5 s (minus one 40 kB burst).
    let rate = 6_000_000.0 / took.as_secs_f64();
    eprintln!("two connections through a {cap} B/s cap: {rate:.0} B/s together");
    assert!(rate <= cap as f64 * 1.1, "measured {rate:.0} B/s through a {cap} B/s cap ({ra:?}, {rb:?})");
    // Generous lower bound: the cap must not collapse the rate either.
    assert!(rate >= cap as f64 * 0.3, "measured {rate:.0} B/s through a {cap} B/s cap");

    // Lifting the cap takes effect at once.
    emu.set_bandwidth(None).unwrap();
    let took = echo_exact(addr, &pattern(4, 8 * MIB)).await;
    assert!(took < Duration::from_secs(2), "8 MiB with no cap took {took:?} (the 4 MB/s cap would need 2 s)");
    assert!(emu.set_bandwidth(Some(0)).is_err(), "a cap of zero is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_resets_connections_refuses_new_ones_and_restore_recovers() {
    let (target, mut accepted) = stalled_server().await;
    let emu = emulator(target, 5, None).await;
    let addr = emu.local_addr();

    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"hello").await.unwrap();
    let mut server_side = tokio::time::timeout(Duration::from_secs(5), accepted.recv()).await.unwrap().unwrap();
    let mut got = [0u8; 5];
    server_side.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello");
    assert_eq!(emu.stats().connections_active, 1);

    emu.cut().await;
    let st = emu.stats();
    assert!(st.cut);
    assert_eq!(st.connections_active, 0);
    // Both peers see a dead link: a reset (or at worst an end of stream), never more data.
    let mut buf = [0u8; 16];
    match client.read(&mut buf).await {
        Ok(0) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
        Ok(n) => panic!("client read {n} bytes from a cut link"),
    }
    match server_side.read(&mut buf).await {
        Ok(0) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
        Ok(n) => panic!("server read {n} bytes from a cut link"),
    }
    let e = TcpStream::connect(addr).await.expect_err("connect through a cut link");
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");

    emu.restore().await;
    assert!(!emu.stats().cut);
    let mut client = TcpStream::connect(addr).await.expect("connect after restore");
    let data = pattern(5, 300_000);
    client.write_all(&data).await.unwrap();
    let mut server_side = tokio::time::timeout(Duration::from_secs(5), accepted.recv()).await.unwrap().unwrap();
    let mut got = vec![0u8; data.len()];
    server_side.read_exact(&mut got).await.unwrap();
    assert!(got == data, "bytes after restore");
    assert_eq!(emu.stats().connections_total, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffering_is_bounded_when_the_receiver_stalls() {
    let (target, mut accepted) = stalled_server().await;
    let mut cfg = WanConfig::new("127.0.0.1:0".parse().unwrap(), target);
    cfg.conn_buffer_bytes_max = 256 * 1024;
    let emu = WanEmulator::start(cfg).await.unwrap();
    let client = TcpStream::connect(emu.local_addr()).await.unwrap();
    let _server_side = accepted.recv().await.unwrap();
    let (_r, mut w) = client.into_split();
    let chunk = pattern(6, MIB);
    // The write blocks once kernel buffers and the proxy's bounded delay line are full.
    let writer = tokio::spawn(async move {
        for _ in 0..256 {
            w.write_all(&chunk).await.unwrap();
        }
    });
    let mut peak = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(emu.stats().bytes_in_flight_up);
    }
    assert!(!writer.is_finished(), "256 MiB written to a peer that never reads");
    assert!(peak > 0, "the proxy holds some bytes for a stalled peer");
    assert!(peak <= 256 * 1024, "the proxy held {peak} bytes for one direction, over its 256 KiB limit");
    writer.abort();

    let mut tiny = WanConfig::new("127.0.0.1:0".parse().unwrap(), target);
    tiny.conn_buffer_bytes_max = 1000;
    assert!(WanEmulator::start(tiny).await.is_err(), "a buffer smaller than one read chunk is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_port_drives_the_link() {
    let mut cfg = WanConfig::new("127.0.0.1:0".parse().unwrap(), echo_server().await);
    cfg.control = Some("127.0.0.1:0".parse().unwrap());
    let emu = WanEmulator::start(cfg).await.unwrap();
    let ctl = TcpStream::connect(emu.control_addr().unwrap()).await.unwrap();
    let (r, mut w) = ctl.into_split();
    let mut lines = BufReader::new(r).lines();
    let mut ask = async |cmd: &str| -> String {
        w.write_all(format!("{cmd}\n").as_bytes()).await.unwrap();
        lines.next_line().await.unwrap().expect("a reply line")
    };
    assert_eq!(ask("set delay-ms 20").await, "ok delay-ms 20");
    assert_eq!(ask("set bandwidth-mbit 80").await, "ok bandwidth-mbit 80");
    assert_eq!(emu.stats().delay, Duration::from_millis(20));
    assert_eq!(emu.stats().bandwidth_bytes_per_s, Some(10_000_000));
    echo_exact(emu.local_addr(), &pattern(7, 100_000)).await;

    let status = ask("status").await;
    let json: serde_json::Value = serde_json::from_str(status.strip_prefix("ok ").expect("ok prefix")).unwrap();
    assert_eq!(json["cut"], false);
    assert_eq!(json["delay_ms"], 20.0);
    assert_eq!(json["bandwidth_mbit"], 80.0);
    assert_eq!(json["bytes_up"], 100_000);
    assert_eq!(json["bytes_down"], 100_000);

    assert_eq!(ask("cut").await, "ok cut");
    assert!(TcpStream::connect(emu.local_addr()).await.is_err());
    assert_eq!(ask("restore").await, "ok restored");
    echo_exact(emu.local_addr(), &pattern(8, 1000)).await;
    assert_eq!(ask("set bandwidth-mbit off").await, "ok bandwidth-mbit off");
    assert_eq!(emu.stats().bandwidth_bytes_per_s, None);

    for bad in ["launch", "set delay-ms -4", "set delay-ms soon", "set bandwidth-mbit 0", "set", ""] {
        let reply = ask(bad).await;
        assert!(reply.starts_with("error: "), "{bad:?} → {reply:?}");
    }
    assert_eq!(emu.stats().delay, Duration::from_millis(20), "a refused command changes nothing");
}
