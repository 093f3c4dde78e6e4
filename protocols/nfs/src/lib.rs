//! Aquifer's NFSv3 adapter (RFC 1813) with the MOUNT protocol on the same TCP port.
//!
//! The wire types and XDR codec come from `nfs3_types`, the crate `nfs3_server` is built on.
//! The RPC loop and the procedures are ours rather than `nfs3_server`'s because its
//! file-system traits do not carry the caller's AUTH_SYS credential into each call (the
//! engine must check permissions per caller), it maps REMOVE and RMDIR to one operation,
//! offers no LINK, serves one export per listener and accepts record marks of any size.
//!
//! File handles are 24 bytes and name the export, the inode and the inode's generation
//! (see `handle.rs`), so they survive a restart and a reused inode number reads as stale.

mod exports;
mod handle;
mod mount;
mod proc;
mod readahead;
mod rpc;
pub mod wire;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use storage_engine::Engine;
use tokio::net::TcpListener;

pub use exports::{EXPORT_CLIENTS_MAX, EXPORT_SETTING_NS, ExportError, ExportInfo, ExportPatch, ExportSource, ExportTable};
pub use rpc::{IDLE_CONNECTION_TIMEOUT_MS, INFLIGHT_REQUESTS_MAX, RECORD_BYTES_MAX};

/// Largest READ or WRITE payload the server offers and accepts, in bytes.
pub const IO_BYTES_MAX: u32 = 1 << 20;

/// One exported directory of the namespace.
#[derive(Debug, Clone)]
pub struct Export {
    /// Path in the namespace, also the path clients mount (`/` or `/projects/a`).
    pub path: String,
    /// Who may mount and use it: `*`, an address (`10.0.0.5`) or a network (`10.0.0.0/8`).
    pub clients: Vec<String>,
    pub read_only: bool,
    /// Map uid 0 to the anonymous user (65534).
    pub root_squash: bool,
}

/// Runs the NFSv3 and MOUNT service on an already bound listener until `shutdown` resolves,
/// with `exports` plus the exports stored in the engine's settings.
pub async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    exports: Vec<Export>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    serve_table(ExportTable::new(engine, exports)?, listener, shutdown).await
}

/// [`serve`] with an export table that may change while the service runs.
pub async fn serve_table(
    exports: ExportTable,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    serve_table_opts(exports, ServeOptions::default(), listener, shutdown).await
}

/// Limits of the service beyond its constants.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// A connection with no call in progress that completes no call for this long is closed
    /// (clients reconnect when they next need the server, as they do with the Linux kernel
    /// server, which closes idle connections after about six minutes); `None` is
    /// [`IDLE_CONNECTION_TIMEOUT_MS`].
    pub idle_connection_timeout_ms: Option<u64>,
}

/// [`serve_table`] with limits other than the defaults.
pub async fn serve_table_opts(
    exports: ExportTable,
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let idle = std::time::Duration::from_millis(opts.idle_connection_timeout_ms.unwrap_or(IDLE_CONNECTION_TIMEOUT_MS));
    let state = Arc::new(proc::State::new(exports));
    rpc::accept_loop(state, idle, listener, shutdown).await
}

/// Binds `addr` and runs [`serve`] on it.
pub async fn serve_addr(
    engine: Arc<Engine>,
    addr: SocketAddr,
    exports: Vec<Export>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("bind NFS listener {addr}"))?;
    serve(engine, listener, exports, shutdown).await
}

/// One entry of an export's client list.
#[derive(Debug, Clone)]
pub(crate) enum ClientMatch {
    Any,
    Net { addr: IpAddr, prefix_bits: u8 },
}

impl ClientMatch {
    pub(crate) fn parse(s: &str) -> anyhow::Result<ClientMatch> {
        let s = s.trim();
        if s == "*" {
            return Ok(ClientMatch::Any);
        }
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().with_context(|| format!("parse export client {s:?}"))?;
        let full = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_bits = match bits {
            Some(b) => b.parse::<u8>().ok().filter(|b| *b <= full).with_context(|| format!("parse prefix length in {s:?}"))?,
            None => full,
        };
        Ok(ClientMatch::Net { addr, prefix_bits })
    }

    pub(crate) fn matches(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        match (self, peer) {
            (ClientMatch::Any, _) => true,
            (ClientMatch::Net { addr: IpAddr::V4(net), prefix_bits }, IpAddr::V4(p)) => {
                let mask = if *prefix_bits == 0 { 0 } else { u32::MAX << (32 - u32::from(*prefix_bits)) };
                u32::from(*net) & mask == u32::from(p) & mask
            }
            (ClientMatch::Net { addr: IpAddr::V6(net), prefix_bits }, IpAddr::V6(p)) => {
                let mask = if *prefix_bits == 0 { 0 } else { u128::MAX << (128 - u32::from(*prefix_bits)) };
                u128::from(*net) & mask == u128::from(p) & mask
            }
            _ => false,
        }
    }
}
