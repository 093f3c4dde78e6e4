//! `aquifer wan-emulator`: runs the fabric's WAN emulator (fabric/src/wan.rs) as a process, so
//! that two daemons on one machine can be put 60 ms apart for tests and benchmarks.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use fabric::wan::{WanConfig, WanEmulator, parse_mbit};

#[derive(Args, Debug)]
pub struct WanArgs {
    /// Address clients connect to (port 0 picks one; the chosen address is printed).
    #[arg(long)]
    listen: SocketAddr,
    /// Address every connection is forwarded to.
    #[arg(long)]
    target: SocketAddr,
    /// One-way delay added in each direction, in milliseconds (60 ms RTT = 30).
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Cap per direction in megabits per second (10^6 bits), shared by all connections.
    #[arg(long)]
    bandwidth_mbit: Option<String>,
    /// Bytes one direction of one connection may hold in the delay line (suffix KiB/MiB).
    #[arg(long, default_value = "8MiB", value_parser = crate::bench_train::parse_size)]
    conn_buffer: u64,
    /// Line-based control port: cut, restore, status, set delay-ms N, set bandwidth-mbit N|off.
    /// No authentication: keep it on loopback.
    #[arg(long)]
    control: Option<SocketAddr>,
}

pub fn run(a: WanArgs) -> Result<()> {
    if !(a.delay_ms.is_finite() && (0.0..=3_600_000.0).contains(&a.delay_ms)) {
        bail!("--delay-ms must be between 0 and 3600000");
    }
    let mut cfg = WanConfig::new(a.listen, a.target);
    cfg.delay = Duration::from_secs_f64(a.delay_ms / 1000.0);
    cfg.bandwidth_bytes_per_s = match a.bandwidth_mbit.as_deref() {
        None | Some("off") => None,
        Some(s) => Some(parse_mbit(s).with_context(|| format!("--bandwidth-mbit {s:?}: a positive number of megabits per second, or off"))?),
    };
    cfg.conn_buffer_bytes_max = usize::try_from(a.conn_buffer).context("--conn-buffer is too large")?;
    cfg.control = a.control;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the async runtime")?;
    rt.block_on(async {
        let emu = WanEmulator::start(cfg).await.with_context(|| format!("start the WAN emulator on {}", a.listen))?;
        let control = emu.control_addr().map(|c| format!(", control {c}")).unwrap_or_default();
        println!(
            "WAN emulator at {} -> {} (one-way delay {} ms, cap {}{control})",
            emu.local_addr(),
            a.target,
            a.delay_ms,
            a.bandwidth_mbit.as_deref().map_or("none".to_string(), |m| format!("{m} Mbit/s")),
        );
        tokio::signal::ctrl_c().await.context("wait for Ctrl-C")?;
        let s = emu.stats();
        println!("WAN emulator stopping: {} bytes up, {} bytes down, {} connections", s.bytes_up, s.bytes_down, s.connections_total);
        Ok(())
    })
}
