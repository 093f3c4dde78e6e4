//! WAN emulator: a TCP proxy that puts a wide-area link between two daemons on one machine.
//!
//! The kernel's netem is not available on the machines Aquifer is developed and tested on, so
//! portals are tested (and the `train` benchmark is run hub-vs-spoke) through this proxy. It
//! reproduces the three properties of a WAN that matter to the fabric:
//!
//! - **One-way delay, pipelined.** Every chunk read from one side is stamped with its arrival
//!   time and released to the other side at `arrival + delay` (a delay line). Many chunks are in
//!   flight at once, so a link with a 30 ms one-way delay still carries its full bandwidth when
//!   the sender keeps enough data in flight; only the round trip grows.
//! - **A bandwidth cap per direction**, a token bucket shared by every connection through one
//!   emulator (the link is shared, not each connection).
//! - **Cut and restore.** A cut resets every proxied connection (both sides see `ECONNRESET`,
//!   never a clean end of stream that could pass for a complete reply, and bytes in the delay
//!   line are lost, as they would be on a dead link) and closes the listening socket, so new
//!   connects are refused. Restore listens again on the same address.
//!
//! Memory is bounded: each direction of each connection holds at most
//! [`WanConfig::conn_buffer_bytes_max`] bytes in its delay line; when it is full the proxy stops
//! reading and TCP flow control pushes back on the sender.
//!
//! The proxy terminates TCP on each side (split TCP): the sender's congestion control sees the
//! loopback, not the emulated round trip. What the emulator reproduces is what the application
//! sees: round-trip latency, link bandwidth, and dead links.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;

/// Bytes read from a socket in one go; each read becomes one chunk of the delay line.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Bytes written per token-bucket reservation, so that a low cap is smooth, not bursty.
const SHAPING_PIECE_BYTES: usize = 16 * 1024;
/// Longest control-port command line accepted.
const CONTROL_LINE_BYTES_MAX: u64 = 1024;
/// How long the proxy waits for the target to accept a connection.
const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How an emulator is set up. Everything but the addresses can be changed while it runs.
#[derive(Clone, Debug)]
pub struct WanConfig {
    /// Where clients connect (port 0 picks one; see [`WanEmulator::local_addr`]).
    pub listen: SocketAddr,
    /// Where each accepted connection is forwarded.
    pub target: SocketAddr,
    /// One-way delay added in each direction.
    pub delay: Duration,
    /// Cap per direction in bytes per second, shared by all connections; `None` = no cap.
    pub bandwidth_bytes_per_s: Option<u64>,
    /// Bytes one direction of one connection may hold in its delay line. Must cover
    /// bandwidth × delay for the link to run at full rate (1 Gbit/s × 30 ms = 3.75 MB).
    pub conn_buffer_bytes_max: usize,
    /// Optional line-based control port (`cut`, `restore`, `status`, `set delay-ms N`,
    /// `set bandwidth-mbit N|off`). It has no authentication: bind it to loopback.
    pub control: Option<SocketAddr>,
}

impl WanConfig {
    pub fn new(listen: SocketAddr, target: SocketAddr) -> WanConfig {
        WanConfig {
            listen,
            target,
            delay: Duration::ZERO,
            bandwidth_bytes_per_s: None,
            conn_buffer_bytes_max: 8 * 1024 * 1024,
            control: None,
        }
    }
}

/// Counters since the emulator started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WanStats {
    /// Bytes delivered from clients to the target.
    pub bytes_up: u64,
    /// Bytes delivered from the target to clients.
    pub bytes_down: u64,
    /// Bytes read by the proxy and not yet delivered (in delay lines), up and down.
    pub bytes_in_flight_up: u64,
    pub bytes_in_flight_down: u64,
    pub connections_total: u64,
    pub connections_active: u64,
    pub cut: bool,
    pub delay: Duration,
    pub bandwidth_bytes_per_s: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default)]
struct LinkState {
    cut: bool,
    shutdown: bool,
}

/// A token bucket with reservations: a writer takes `n` tokens at once (the count may go
/// negative) and sleeps for the debt, so concurrent writers share the rate in arrival order.
struct Bucket {
    rate_bytes_per_s: Option<u64>,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn burst_bytes(rate: u64) -> f64 {
        // 10 ms worth, at least one shaping piece, so timer granularity does not lower the rate.
        ((rate / 100) as f64).max(SHAPING_PIECE_BYTES as f64)
    }

    /// Takes `n` bytes' worth of tokens and returns how long the caller must wait before sending.
    fn reserve(&mut self, n: usize, now: Instant) -> Duration {
        let Some(rate) = self.rate_bytes_per_s else { return Duration::ZERO };
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * rate as f64).min(Self::burst_bytes(rate));
        self.tokens -= n as f64;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / rate as f64) }
    }

    fn set_rate(&mut self, rate: Option<u64>) {
        self.rate_bytes_per_s = rate;
        self.tokens = 0.0;
        self.last = Instant::now();
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Up,
    Down,
}

struct Shared {
    target: SocketAddr,
    delay_us: AtomicU64,
    conn_buffer_bytes_max: usize,
    buckets: [Mutex<Bucket>; 2],
    bytes: [AtomicU64; 2],
    in_flight: [AtomicU64; 2],
    connections_total: AtomicU64,
    state: watch::Sender<LinkState>,
    /// Connections being proxied (including ones accepted and not yet connected to the target).
    active: watch::Sender<u64>,
    /// Whether the accept loop currently has its listening socket open.
    listening: watch::Sender<bool>,
}

/// A running emulator. Dropping it stops the proxy and resets its connections.
pub struct WanEmulator {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    control_addr: Option<SocketAddr>,
}

impl WanEmulator {
    /// Binds the listening (and control) sockets and starts proxying.
    pub async fn start(cfg: WanConfig) -> io::Result<WanEmulator> {
        if cfg.conn_buffer_bytes_max < READ_CHUNK_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("conn_buffer_bytes_max {} is below one read chunk ({READ_CHUNK_BYTES} bytes)", cfg.conn_buffer_bytes_max),
            ));
        }
        if cfg.bandwidth_bytes_per_s == Some(0) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a bandwidth cap of 0 bytes/s carries nothing; use a cut instead"));
        }
        let listener = bind_listener(cfg.listen)?;
        let local_addr = listener.local_addr()?;
        let bucket = || Mutex::new(Bucket { rate_bytes_per_s: cfg.bandwidth_bytes_per_s, tokens: 0.0, last: Instant::now() });
        let shared = Arc::new(Shared {
            target: cfg.target,
            delay_us: AtomicU64::new(duration_us(cfg.delay)),
            conn_buffer_bytes_max: cfg.conn_buffer_bytes_max,
            buckets: [bucket(), bucket()],
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
            in_flight: [AtomicU64::new(0), AtomicU64::new(0)],
            connections_total: AtomicU64::new(0),
            state: watch::Sender::new(LinkState::default()),
            active: watch::Sender::new(0),
            listening: watch::Sender::new(true),
        });
        let control_addr = match cfg.control {
            Some(addr) => {
                let l = TcpListener::bind(addr).await?;
                let a = l.local_addr()?;
                tokio::spawn(control_loop(l, shared.clone()));
                Some(a)
            }
            None => None,
        };
        tokio::spawn(accept_loop(listener, local_addr, shared.clone()));
        Ok(WanEmulator { shared, local_addr, control_addr })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The control port's address, when one was asked for.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control_addr
    }

    /// Cuts the link. Returns once every proxied connection has been reset and the listening
    /// socket is closed, so a connect made after it is refused.
    pub async fn cut(&self) {
        self.shared.cut().await
    }

    /// Restores the link. Returns once the listening socket accepts again.
    pub async fn restore(&self) {
        self.shared.restore().await
    }

    /// Changes the one-way delay for bytes read from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.delay_us.store(duration_us(delay), Ordering::Relaxed);
    }

    /// Changes the cap (bytes per second per direction); `None` removes it, `Some(0)` is refused.
    pub fn set_bandwidth(&self, bytes_per_s: Option<u64>) -> io::Result<()> {
        self.shared.set_bandwidth(bytes_per_s)
    }

    pub fn stats(&self) -> WanStats {
        self.shared.stats()
    }
}

impl Drop for WanEmulator {
    fn drop(&mut self) {
        self.shared.state.send_modify(|s| s.shutdown = true);
    }
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // Restore binds the same port again while reset connections may linger in the kernel.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl Shared {
    async fn cut(&self) {
        self.state.send_modify(|s| s.cut = true);
        let mut listening = self.listening.subscribe();
        let mut active = self.active.subscribe();
        // The accept loop and every connection task watch `state`; both waits end promptly.
        let _ = listening.wait_for(|l| !*l).await;
        let _ = active.wait_for(|n| *n == 0).await;
        tracing::info!("WAN emulator: link cut");
    }

    async fn restore(&self) {
        self.state.send_modify(|s| s.cut = false);
        let _ = self.listening.subscribe().wait_for(|l| *l).await;
        tracing::info!("WAN emulator: link restored");
    }

    fn set_bandwidth(&self, bytes_per_s: Option<u64>) -> io::Result<()> {
        if bytes_per_s == Some(0) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a bandwidth cap of 0 bytes/s carries nothing; use a cut instead"));
        }
        for b in &self.buckets {
            b.lock().set_rate(bytes_per_s);
        }
        Ok(())
    }

    fn stats(&self) -> WanStats {
        WanStats {
            bytes_up: self.bytes[0].load(Ordering::Relaxed),
            bytes_down: self.bytes[1].load(Ordering::Relaxed),
            bytes_in_flight_up: self.in_flight[0].load(Ordering::Relaxed),
            bytes_in_flight_down: self.in_flight[1].load(Ordering::Relaxed),
            connections_total: self.connections_total.load(Ordering::Relaxed),
            connections_active: *self.active.borrow(),
            cut: self.state.borrow().cut,
            delay: Duration::from_micros(self.delay_us.load(Ordering::Relaxed)),
            bandwidth_bytes_per_s: self.buckets[0].lock().rate_bytes_per_s,
        }
    }
}

async fn accept_loop(first: TcpListener, addr: SocketAddr, shared: Arc<Shared>) {
    let mut state = shared.state.subscribe();
    let mut listener = Some(first);
    loop {
        let st = *state.borrow_and_update();
        if st.shutdown {
            return;
        }
        if st.cut && listener.is_some() {
            listener = None;
            shared.listening.send_replace(false);
        } else if !st.cut && listener.is_none() {
            match bind_listener(addr) {
                Ok(l) => {
                    listener = Some(l);
                    shared.listening.send_replace(true);
                }
                Err(e) => {
                    tracing::warn!("WAN emulator: listen again on {addr}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let Some(l) = &listener else {
            if state.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            r = l.accept() => match r {
                Ok((client, _)) => {
                    shared.connections_total.fetch_add(1, Ordering::Relaxed);
                    shared.active.send_modify(|n| *n += 1);
                    let s = shared.clone();
                    tokio::spawn(async move {
                        proxy_connection(client, &s).await;
                        s.active.send_modify(|n| *n -= 1);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!("WAN emulator: accept on {addr}: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = state.changed() => {}
        }
    }
}

async fn proxy_connection(client: TcpStream, shared: &Shared) {
    let mut state = shared.state.subscribe();
    let dead = |s: &LinkState| s.cut || s.shutdown;
    let target = tokio::select! {
        r = tokio::time::timeout(TARGET_CONNECT_TIMEOUT, TcpStream::connect(shared.target)) => r,
        _ = until(&mut state, dead) => { reset(&client); return; }
    };
    let target = match target {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            tracing::warn!("WAN emulator: connect to target {}: {e}", shared.target);
            reset(&client);
            return;
        }
        Err(_) => {
            tracing::warn!("WAN emulator: connect to target {}: timed out", shared.target);
            reset(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = target.set_nodelay(true);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut target_rd, mut target_wr) = target.into_split();
    let clean = tokio::select! {
        r = async {
            tokio::try_join!(
                pump(&mut client_rd, &mut target_wr, shared, Direction::Up),
                pump(&mut target_rd, &mut client_wr, shared, Direction::Down),
            )
        } => r.is_ok(),
        _ = until(&mut state, dead) => false,
    };
    if !clean {
        // A cut, shutdown, or a reset on one side: the other side sees a reset too.
        reset(client_rd.as_ref());
        reset(target_rd.as_ref());
    }
}

/// Waits until the link state satisfies `f` (or the emulator is gone).
async fn until(state: &mut watch::Receiver<LinkState>, f: impl FnMut(&LinkState) -> bool) {
    // The guard `wait_for` returns is not Send; drop it here rather than across an await.
    let _ = state.wait_for(f).await.is_ok();
}

fn reset(s: &TcpStream) {
    // SO_LINGER 0 makes close() send RST and discard unsent bytes: a dead link, not an EOF.
    let _ = s.set_zero_linger();
}

enum Segment {
    Data { release_at: Instant, bytes: Vec<u8> },
    Eof { release_at: Instant },
}

/// One direction of one connection: a reader that stamps chunks and a writer that releases
/// them after the delay, through the direction's token bucket.
async fn pump(rd: &mut OwnedReadHalf, wr: &mut OwnedWriteHalf, shared: &Shared, dir: Direction) -> io::Result<()> {
    let budget = Semaphore::new(shared.conn_buffer_bytes_max);
    let held = HeldBytes { total: &shared.in_flight[dir as usize], mine: AtomicU64::new(0) };
    let (tx, mut rx) = mpsc::unbounded_channel::<Segment>();
    let reader = async {
        loop {
            // Bytes held in the delay line are bounded by the semaphore; permits come back
            // when the writer has sent the chunk.
            budget.acquire_many(READ_CHUNK_BYTES as u32).await.map_err(io::Error::other)?.forget();
            let mut buf = vec![0u8; READ_CHUNK_BYTES];
            let n = rd.read(&mut buf).await?;
            budget.add_permits(READ_CHUNK_BYTES - n);
            let release_at = Instant::now() + Duration::from_micros(shared.delay_us.load(Ordering::Relaxed));
            if n == 0 {
                let _ = tx.send(Segment::Eof { release_at });
                return Ok::<(), io::Error>(());
            }
            buf.truncate(n);
            held.add(n as u64);
            if tx.send(Segment::Data { release_at, bytes: buf }).is_err() {
                return Ok(());
            }
        }
    };
    let writer = async {
        let bucket = &shared.buckets[dir as usize];
        while let Some(seg) = rx.recv().await {
            match seg {
                Segment::Data { release_at, bytes } => {
                    tokio::time::sleep_until(release_at).await;
                    for piece in bytes.chunks(SHAPING_PIECE_BYTES) {
                        let wait = bucket.lock().reserve(piece.len(), Instant::now());
                        if !wait.is_zero() {
                            tokio::time::sleep(wait).await;
                        }
                        wr.write_all(piece).await?;
                        shared.bytes[dir as usize].fetch_add(piece.len() as u64, Ordering::Relaxed);
                        held.sub(piece.len() as u64);
                    }
                    budget.add_permits(bytes.len());
                }
                Segment::Eof { release_at } => {
                    tokio::time::sleep_until(release_at).await;
                    wr.shutdown().await?;
                    return Ok(());
                }
            }
        }
        Ok(())
    };
    tokio::try_join!(reader, writer).map(|_| ())
}

/// Bytes one pump holds, mirrored into the emulator-wide counter; what is still held when the
/// pump ends (a cut or reset discards it) is taken back out on drop.
struct HeldBytes<'a> {
    total: &'a AtomicU64,
    mine: AtomicU64,
}

impl HeldBytes<'_> {
    fn add(&self, n: u64) {
        self.mine.fetch_add(n, Ordering::Relaxed);
        self.total.fetch_add(n, Ordering::Relaxed);
    }
    fn sub(&self, n: u64) {
        self.mine.fetch_sub(n, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Drop for HeldBytes<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(*self.mine.get_mut(), Ordering::Relaxed);
    }
}

async fn control_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut state = shared.state.subscribe();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((conn, _)) => {
                    let s = shared.clone();
                    tokio::spawn(async move {
                        if let Err(e) = control_session(conn, &s).await {
                            tracing::debug!("WAN emulator control session: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("WAN emulator control accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = until(&mut state, |s| s.shutdown) => return,
        }
    }
}

async fn control_session(conn: TcpStream, shared: &Shared) -> io::Result<()> {
    let (rd, mut wr) = conn.into_split();
    let mut rd = BufReader::new(rd);
    loop {
        let mut line = String::new();
        let n = (&mut rd).take(CONTROL_LINE_BYTES_MAX + 1).read_line(&mut line).await?;
        if n == 0 {
            return Ok(());
        }
        if n as u64 > CONTROL_LINE_BYTES_MAX {
            wr.write_all(format!("error: line longer than {CONTROL_LINE_BYTES_MAX} bytes\n").as_bytes()).await?;
            return Ok(());
        }
        let reply = control_command(line.trim(), shared).await;
        wr.write_all(reply.as_bytes()).await?;
        wr.write_all(b"\n").await?;
    }
}

/// Runs one control command and returns the reply line: `ok ...` or `error: ...`.
async fn control_command(line: &str, shared: &Shared) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["cut"] => {
            shared.cut().await;
            "ok cut".into()
        }
        ["restore"] => {
            shared.restore().await;
            "ok restored".into()
        }
        ["status"] => {
            let s = shared.stats();
            let v = serde_json::json!({
                "cut": s.cut,
                "delay_ms": s.delay.as_secs_f64() * 1000.0,
                "bandwidth_mbit": s.bandwidth_bytes_per_s.map(|b| b as f64 * 8.0 / 1e6),
                "bytes_up": s.bytes_up,
                "bytes_down": s.bytes_down,
                "connections_total": s.connections_total,
                "connections_active": s.connections_active,
            });
            format!("ok {v}")
        }
        ["set", "delay-ms", n] => match n.parse::<f64>() {
            Ok(ms) if ms.is_finite() && (0.0..=3_600_000.0).contains(&ms) => {
                shared.delay_us.store((ms * 1000.0) as u64, Ordering::Relaxed);
                format!("ok delay-ms {ms}")
            }
            _ => format!("error: delay-ms wants a number of milliseconds from 0 to 3600000, got {n:?}"),
        },
        ["set", "bandwidth-mbit", "off"] => match shared.set_bandwidth(None) {
            Ok(()) => "ok bandwidth-mbit off".into(),
            Err(e) => format!("error: {e}"),
        },
        ["set", "bandwidth-mbit", n] => match parse_mbit(n) {
            Some(bytes_per_s) => match shared.set_bandwidth(Some(bytes_per_s)) {
                Ok(()) => format!("ok bandwidth-mbit {n}"),
                Err(e) => format!("error: {e}"),
            },
            None => format!("error: bandwidth-mbit wants a positive number of megabits per second or \"off\", got {n:?}"),
        },
        [] => "error: empty command".into(),
        _ => format!("error: unknown command {line:?} (cut, restore, status, set delay-ms N, set bandwidth-mbit N|off)"),
    }
}

/// Megabits per second (10^6 bits, as link speeds are quoted) to bytes per second.
pub fn parse_mbit(s: &str) -> Option<u64> {
    let mbit: f64 = s.parse().ok()?;
    let bytes = mbit * 1e6 / 8.0;
    (mbit.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_reservations_pace_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket { rate_bytes_per_s: Some(1_000_000), tokens: 0.0, last: t0 };
        // 100 pieces of 10 kB reserved at the same instant: the last waits ~1 s.
        let mut last = Duration::ZERO;
        for _ in 0..100 {
            last = b.reserve(10_000, t0);
        }
        assert!(last >= Duration::from_millis(990) && last <= Duration::from_millis(1000), "{last:?}");
        // After the debt has been paid, a burst of at most 10 ms worth (here one piece) is free.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(b.reserve(SHAPING_PIECE_BYTES, later), Duration::ZERO);
        let mut unlimited = Bucket { rate_bytes_per_s: None, tokens: 0.0, last: t0 };
        assert_eq!(unlimited.reserve(1 << 30, t0), Duration::ZERO);
    }

    #[test]
    fn mbit_parsing() {
        assert_eq!(parse_mbit("1000"), Some(125_000_000));
        assert_eq!(parse_mbit("0.5"), Some(62_500));
        assert_eq!(parse_mbit("0"), None);
        assert_eq!(parse_mbit("-3"), None);
        assert_eq!(parse_mbit("NaN"), None);
        assert_eq!(parse_mbit("fast"), None);
    }
}
