//! Aquifer's SFTP adapter (SFTP version 3 over SSH, `russh` + `russh-sftp`).
//!
//! Users log in with the password of their Aquifer account or a registered SSH key; every
//! file operation runs in the engine as that user. Paths are resolved from the namespace root,
//! or from the user's chroot directory when an admin set one ([`set_chroot`]): `..` at the
//! root stays at the root and symlink targets resolve inside it, so no path leads out.

mod inbound;
mod serve;
mod session;
mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use russh::keys::PrivateKey;
use russh::server::Config;
use storage_engine::{Caller, Engine, Error, FileKind, Ino, ROOT_INO};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

/// SSH sessions served at the same time; further connections wait in the accept queue.
const SESSIONS_MAX: usize = 256;
/// How long a session may take to end after the listener disconnected it.
const DISCONNECT_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct SftpOptions {
    /// The server's host key (OpenSSH format). Generated (Ed25519) on first start and kept.
    pub host_key_path: PathBuf,
    /// A session without traffic for this long is closed.
    pub idle_timeout_s: u64,
    /// Delay before answering a failed login, against password guessing.
    pub auth_rejection_delay_ms: u64,
    /// A connection that has not logged in this long after it was accepted is closed, as
    /// OpenSSH's `LoginGraceTime` (120 s) does, so that connections that never log in cannot
    /// hold the session slots.
    pub login_grace_ms: u64,
}

impl SftpOptions {
    pub fn new(host_key_path: impl Into<PathBuf>) -> SftpOptions {
        SftpOptions { host_key_path: host_key_path.into(), idle_timeout_s: 3600, auth_rejection_delay_ms: 1000, login_grace_ms: 120_000 }
    }
}

/// Confines `user`'s SFTP sessions to the directory at `path` (`Some`), or lifts that
/// (`None`; no chroot is not an error). Admin only. The path must name an existing directory;
/// it is stored normalised and resolved again at each session start (a session of a user
/// whose chroot no longer resolves to a directory is refused). Sessions already open keep the
/// root they started with. The admin API (`/api/v1/sftp/chroots`) writes the same setting
/// through the same engine call.
pub fn set_chroot(engine: &Engine, caller: &Caller, user: &str, path: Option<&str>) -> Result<(), Error> {
    match path {
        None => match engine.sftp_chroot_remove(caller, user) {
            Err(Error::NotFound) => Ok(()),
            r => r,
        },
        Some(p) => engine.sftp_chroot_set(caller, user, p).map(drop),
    }
}

/// `user`'s SFTP chroot, if an admin set one.
pub fn chroot_of(engine: &Engine, user: &str) -> Result<Option<String>, Error> {
    engine.sftp_chroot(user)
}

/// The directory a session of `caller` sees as `/`.
pub(crate) fn session_root(engine: &Engine, caller: &Caller) -> Result<Ino, Error> {
    let Some(path) = chroot_of(engine, &caller.user)? else {
        return Ok(ROOT_INO);
    };
    let a = engine.resolve(&Caller::system(), &path)?;
    if a.kind != FileKind::Dir {
        return Err(Error::NotDir);
    }
    Ok(a.ino)
}

/// Loads the host key at `path`, or generates one and stores it there (mode 0600).
pub fn load_or_create_host_key(path: &Path) -> anyhow::Result<PrivateKey> {
    if path.exists() {
        return russh::keys::load_secret_key(path, None).with_context(|| format!("load SSH host key {}", path.display()));
    }
    let key = PrivateKey::random(&mut rand_ssh::rng(), russh::keys::Algorithm::Ed25519).context("generate SSH host key")?;
    let text = key.to_openssh(russh::keys::ssh_key::LineEnding::LF).context("encode SSH host key")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("write SSH host key {}", tmp.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("install SSH host key {}", path.display()))?;
    info!(path = %path.display(), "generated SSH host key");
    Ok(key)
}

/// Serves SFTP on an already bound listener until `shutdown` resolves.
pub async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    opts: SftpOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let key = load_or_create_host_key(&opts.host_key_path)?;
    let config = Arc::new(Config {
        keys: vec![key],
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey, russh::MethodKind::Password][..]),
        auth_rejection_time: Duration::from_millis(opts.auth_rejection_delay_ms),
        auth_rejection_time_initial: Some(Duration::ZERO),
        inactivity_timeout: Some(Duration::from_secs(opts.idle_timeout_s)),
        ..Default::default()
    });
    let login_grace = Duration::from_millis(opts.login_grace_ms);
    let local = listener.local_addr()?;
    info!(%local, "SFTP service listening");
    let limit = Arc::new(tokio::sync::Semaphore::new(SESSIONS_MAX));
    let mut sessions = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
            permit = limit.clone().acquire_owned() => {
                let permit = permit.expect("session semaphore is never closed");
                let (stream, peer) = tokio::select! {
                    _ = &mut shutdown => break,
                    r = listener.accept() => match r {
                        Ok(x) => x,
                        Err(e) => {
                            debug!("accept SFTP connection: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let handler = session::SshSession::new(engine.clone(), peer);
                let logged_in = handler.logged_in();
                let config = config.clone();
                sessions.spawn(async move {
                    let _permit = permit;
                    let _ = stream.set_nodelay(true);
                    let deadline = tokio::time::Instant::now() + login_grace;
                    let no_login = || info!(%peer, "SSH connection closed: no login within {} s", login_grace.as_secs_f64());
                    // Until the client's version line has come, the connection is this future's
                    // own: dropping it closes the connection.
                    let running = match tokio::time::timeout_at(deadline, russh::server::run_stream(config, stream, handler)).await {
                        Ok(Ok(running)) => running,
                        Ok(Err(e)) => return debug!(%peer, "SSH handshake failed: {e}"),
                        Err(_) => return no_login(),
                    };
                    // From here the session runs in a task of russh's own, which only a
                    // disconnect through its handle ends.
                    let handle = running.handle();
                    tokio::pin!(running);
                    let ended = tokio::select! {
                        r = &mut running => Some(r),
                        _ = tokio::time::sleep_until(deadline) => None,
                    };
                    let ended = match ended {
                        Some(r) => r,
                        None if logged_in.load(std::sync::atomic::Ordering::Acquire) => running.await,
                        None => {
                            no_login();
                            let _ = handle.disconnect(russh::Disconnect::ByApplication, "no login within the grace time".into(), String::new()).await;
                            match tokio::time::timeout(DISCONNECT_WAIT, running).await {
                                Ok(r) => r,
                                Err(_) => return warn!(%peer, "SSH session still running after its disconnect"),
                            }
                        }
                    };
                    if let Err(e) = ended {
                        debug!(%peer, "SSH session ended: {e}");
                    }
                });
            }
        }
    }
    sessions.shutdown().await;
    info!(%local, "SFTP service stopped");
    Ok(())
}
