//! One SSH connection: password login, then the SFTP subsystem mapped onto the engine.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId};
use russh_sftp::protocol::{Attrs, ExtendedReply, File, FileAttributes, Handle, Name, OpenFlags, Packet, Status, StatusCode, Version};
use storage_engine::{Attr, Caller, Engine, Error, FileKind, Ino, ReadBytes, SetAttr, Stability, StatFs, TimeSet, civil_from_days};
use tracing::info;

use crate::serve::data_reply;
use crate::wire::{CLIENT_PACKET_BYTES_MAX, copy_data_args, ids_args, names_reply, ssh_strings, steps};

/// Open file and directory handles per SFTP session.
const HANDLES_MAX: usize = 256;
/// Largest READ answered, in bytes (OpenSSH asks for 32-256 KiB).
const READ_BYTES_MAX: u32 = 256 * 1024;
/// READ and WRITE lengths offered to clients by `limits@openssh.com`: the largest packet less
/// room for a request's header, as OpenSSH's sftp-server offers. Without the extension its
/// client moves 32 KiB a request; with it, 255 KiB.
const TRANSFER_BYTES_OFFERED: u64 = CLIENT_PACKET_BYTES_MAX - 1024;
/// Entries per READDIR answer.
const READDIR_ENTRIES: usize = 128;
/// Symlinks followed while resolving one path (as Linux's MAXSYMLINKS).
const SYMLINK_HOPS_MAX: usize = 40;

pub(crate) struct SshSession {
    engine: Arc<Engine>,
    peer: SocketAddr,
    caller: Option<Caller>,
    /// Set once a login succeeds (the listener closes connections that take too long).
    logged_in: Arc<std::sync::atomic::AtomicBool>,
    channels: HashMap<ChannelId, Channel<Msg>>,
}

impl SshSession {
    pub(crate) fn new(engine: Arc<Engine>, peer: SocketAddr) -> SshSession {
        SshSession { engine, peer, caller: None, logged_in: Arc::default(), channels: HashMap::new() }
    }

    /// Becomes true once this connection has logged in.
    pub(crate) fn logged_in(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.logged_in.clone()
    }

    fn accept(&mut self, caller: Caller) -> Auth {
        self.caller = Some(caller);
        self.logged_in.store(true, std::sync::atomic::Ordering::Release);
        Auth::Accept
    }

    /// Whether `key` is one of `user`'s registered SSH keys. Stored lines that do not parse
    /// are skipped (they were checked for shape only when added).
    async fn key_registered(&self, user: &str, key: &russh::keys::ssh_key::PublicKey) -> bool {
        let engine = self.engine.clone();
        let u = user.to_string();
        let Ok(Ok(keys)) = tokio::task::spawn_blocking(move || engine.ssh_keys_of(&u)).await else {
            return false;
        };
        keys.iter()
            .filter_map(|(_, line)| russh::keys::ssh_key::PublicKey::from_openssh(line).ok())
            .any(|k| k.key_data() == key.key_data())
    }
}

impl russh::server::Handler for SshSession {
    type Error = anyhow::Error;

    async fn auth_password(&mut self, user: &str, password: &str) -> Result<Auth, Self::Error> {
        let engine = self.engine.clone();
        let (u, p) = (user.to_string(), password.to_string());
        let r = tokio::task::spawn_blocking(move || engine.authenticate_password(&u, &p)).await?;
        match r {
            Ok(caller) => {
                info!(peer = %self.peer, user, "SFTP login");
                Ok(self.accept(caller))
            }
            Err(_) => {
                info!(peer = %self.peer, user, "SFTP login refused");
                Ok(Auth::Reject { proceed_with_methods: None, partial_success: false })
            }
        }
    }

    /// Only keys the user registered (REST `POST /api/v1/users/{name}/ssh-keys`) proceed to the
    /// signature check.
    async fn auth_publickey_offered(&mut self, user: &str, offer: russh::server::PublicKeyOffer<'_>) -> Result<Auth, Self::Error> {
        if self.key_registered(user, offer.public_key).await {
            Ok(Auth::Accept)
        } else {
            Ok(Auth::Reject { proceed_with_methods: None, partial_success: false })
        }
    }

    /// Called once russh has verified the client's signature with the key.
    async fn auth_publickey(&mut self, user: &str, key: russh::server::VerifiedPublicKey<'_>) -> Result<Auth, Self::Error> {
        if !self.key_registered(user, key.public_key).await {
            return Ok(Auth::Reject { proceed_with_methods: None, partial_success: false });
        }
        let engine = self.engine.clone();
        let u = user.to_string();
        match tokio::task::spawn_blocking(move || engine.caller_for_user(&u)).await? {
            Ok(caller) => {
                info!(peer = %self.peer, user, "SFTP login with a public key");
                Ok(self.accept(caller))
            }
            Err(_) => Ok(Auth::Reject { proceed_with_methods: None, partial_success: false }),
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels.insert(channel.id(), channel);
        reply.accept().await;
        Ok(())
    }

    async fn channel_eof(&mut self, channel: ChannelId, session: &mut Session) -> Result<(), Self::Error> {
        session.close(channel)?;
        Ok(())
    }

    // The service offers the SFTP subsystem only. Every other channel request is refused
    // with CHANNEL_FAILURE (when the client asked for a reply): left unanswered, a client
    // waits for good (rclone runs `echo` through exec to detect the remote shell, and falls
    // back to plain SFTP when that fails).
    async fn exec_request(&mut self, channel: ChannelId, data: &[u8], session: &mut Session) -> Result<(), Self::Error> {
        info!(peer = %self.peer, command = %String::from_utf8_lossy(data), "SSH exec refused: this service offers SFTP only");
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn shell_request(&mut self, channel: ChannelId, session: &mut Session) -> Result<(), Self::Error> {
        info!(peer = %self.peer, "SSH shell refused: this service offers SFTP only");
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _col_width: u32,
        _row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn env_request(&mut self, channel: ChannelId, _name: &str, _value: &str, session: &mut Session) -> Result<(), Self::Error> {
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn x11_request(
        &mut self,
        channel: ChannelId,
        _single_connection: bool,
        _protocol: &str,
        _cookie: &str,
        _screen: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn subsystem_request(&mut self, channel_id: ChannelId, name: &str, session: &mut Session) -> Result<(), Self::Error> {
        match (name, self.caller.clone(), self.channels.remove(&channel_id)) {
            ("sftp", Some(caller), Some(channel)) => {
                // A user with a chroot whose directory cannot be resolved gets no session at
                // all rather than the whole namespace.
                let (engine, c) = (self.engine.clone(), caller.clone());
                let root = match tokio::task::spawn_blocking(move || crate::session_root(&engine, &c)).await? {
                    Ok(root) => root,
                    Err(e) => {
                        info!(peer = %self.peer, user = %caller.user, "SFTP refused: chroot not usable: {e}");
                        session.channel_failure(channel_id)?;
                        return Ok(());
                    }
                };
                session.channel_success(channel_id)?;
                let sftp = SftpSession { engine: self.engine.clone(), caller, root, handles: HashMap::new(), next_handle: 0, ahead: HashMap::new() };
                tokio::spawn(crate::serve::run(crate::inbound::stream(channel), sftp));
            }
            _ => session.channel_failure(channel_id)?,
        }
        Ok(())
    }
}

enum Open {
    /// An open file and what it was opened for.
    File { ino: Ino, append: bool, read: bool, write: bool },
    Dir { ino: Ino, cursor: Option<Vec<u8>>, done: bool },
}

/// What a request does through a file handle.
#[derive(Clone, Copy)]
enum Use {
    Read,
    Write,
    /// FSTAT, FSETSTAT, fsync: allowed whatever the handle was opened for.
    Any,
}

pub(crate) struct SftpSession {
    engine: Arc<Engine>,
    caller: Caller,
    /// The directory this session sees as `/`: the namespace root, or the user's chroot.
    root: Ino,
    handles: HashMap<String, Open>,
    next_handle: u64,
    /// Readahead of open files read sequentially, by handle.
    ahead: HashMap<String, SeqRead>,
}

/// Bytes read ahead in one engine call for a handle read sequentially: two stripes of the
/// default geometry, so each drive serves one 2 MiB request into a huge-page buffer. 1 GiB
/// sftp gets, A/B against 2 MiB windows: 404-460 against 300-370 MiB/s, daemon CPU 1.5-1.7
/// against 1.9-2.5 s (docs/benchmarks.md).
const READAHEAD_BYTES: usize = 8 << 20;
/// The window once [`READAHEAD_HANDLES_LARGE`] handles of the session hold windows, which
/// bounds a session's readahead memory near what 2 MiB windows took before.
const READAHEAD_BYTES_SMALL: usize = 2 << 20;
/// Handles of a session that may read ahead [`READAHEAD_BYTES`] at once.
const READAHEAD_HANDLES_LARGE: usize = 4;

/// A window of a file: its start, the bytes where the drives read them (`Engine::read_shared`:
/// no copy into one buffer; each READ copies its part into its reply), and the file's (size,
/// mtime, ctime) when read.
type Window = (u64, Vec<ReadBytes>, (u64, i64, i64));

fn window_len(w: &Window) -> usize {
    w.1.iter().map(|p| p.len()).sum()
}

/// russh-sftp answers a session's requests one at a time, so a client's pipelined READs of
/// 32-256 KiB would each wait for an engine read. A handle read sequentially instead gets the
/// next window read in the background while the current one serves the READs. A window is
/// checked against the file's size, mtime and ctime when it is taken into use, and dropped
/// by any write through the session.
struct SeqRead {
    /// Where the next sequential READ starts.
    next: u64,
    current: Option<Window>,
    pending: Option<(u64, tokio::task::JoinHandle<Result<Window, Error>>)>,
}

fn code(e: &Error) -> StatusCode {
    match e {
        Error::NotFound => StatusCode::NoSuchFile,
        Error::PermissionDenied | Error::Unauthenticated => StatusCode::PermissionDenied,
        Error::NotSupported(_) => StatusCode::OpUnsupported,
        _ => StatusCode::Failure,
    }
}

fn ok(id: u32) -> Status {
    Status { id, status_code: StatusCode::Ok, error_message: "Ok".into(), language_tag: "en-US".into() }
}

fn attrs_of(a: &Attr) -> FileAttributes {
    let kind = match a.kind {
        FileKind::File => 0o100000,
        FileKind::Dir => 0o040000,
        FileKind::Symlink => 0o120000,
        FileKind::Fifo => 0o010000,
        FileKind::Socket => 0o140000,
        FileKind::CharDevice => 0o020000,
        FileKind::BlockDevice => 0o060000,
    };
    FileAttributes {
        size: Some(a.size),
        uid: Some(a.uid),
        user: None,
        gid: Some(a.gid),
        group: None,
        permissions: Some(kind | (a.mode & 0o7777)),
        atime: Some((a.atime_ns.max(0) / 1_000_000_000) as u32),
        mtime: Some((a.mtime_ns.max(0) / 1_000_000_000) as u32),
    }
}

/// Account and group names for the entries of one listing or request, each looked up once.
#[derive(Default)]
struct OwnerNames {
    users: HashMap<u32, Option<String>>,
    groups: HashMap<u32, Option<String>>,
}

impl OwnerNames {
    fn user(&mut self, e: &Engine, uid: u32) -> Option<&str> {
        self.users.entry(uid).or_insert_with(|| e.user_name(uid).ok().flatten()).as_deref()
    }

    fn group(&mut self, e: &Engine, gid: u32) -> Option<&str> {
        self.groups.entry(gid).or_insert_with(|| e.group_name(gid).ok().flatten()).as_deref()
    }

    /// The owner and group of `a` as a listing shows them: by name, or by number where the
    /// id has none (as `ls -l`).
    fn shown(&mut self, e: &Engine, a: &Attr) -> (String, String) {
        let user = self.user(e, a.uid).map_or_else(|| a.uid.to_string(), str::to_owned);
        let group = self.group(e, a.gid).map_or_else(|| a.gid.to_string(), str::to_owned);
        (user, group)
    }
}

/// A modification time as `ls -l` and OpenSSH's server show it, in UTC: month, day and time
/// for the last six months, month, day and year otherwise (and for times ahead of `now_s`).
fn ls_time(mtime_s: i64, now_s: i64) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (year, month, day) = civil_from_days(mtime_s.div_euclid(86_400));
    let month = MONTHS[month as usize - 1];
    if now_s - 365 * 86_400 / 2 < mtime_s && mtime_s <= now_s {
        let secs = mtime_s.rem_euclid(86_400);
        format!("{month} {day:>2} {:02}:{:02}", secs / 3600, secs % 3600 / 60)
    } else {
        format!("{month} {day:>2}  {year}")
    }
}

/// An entry's line in a directory listing, as OpenSSH's server writes it (its client's
/// `ls -l` prints it as it is): mode, links, owner and group by name, size, time, name.
fn longname(name: &str, a: &Attr, user: &str, group: &str, now_s: i64) -> String {
    let t = match a.kind {
        FileKind::File => '-',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
    };
    let mut perms = String::new();
    // Owner, group, others; setuid, setgid and sticky show in the execute column (s/S, t/T).
    for (shift, special, mark) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let b = (a.mode >> shift) & 7;
        perms.push(if b & 4 != 0 { 'r' } else { '-' });
        perms.push(if b & 2 != 0 { 'w' } else { '-' });
        perms.push(match (b & 1 != 0, a.mode & special != 0) {
            (true, true) => mark,
            (false, true) => mark.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    let time = ls_time(a.mtime_ns.div_euclid(1_000_000_000), now_s);
    format!("{t}{perms} {:>3} {user:<8} {group:<8} {:>8} {time} {name}", a.nlink, a.size)
}

fn setattr_of(a: &FileAttributes) -> SetAttr {
    SetAttr {
        mode: a.permissions.map(|p| p & 0o7777),
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        atime: a.atime.map(|t| TimeSet::At(i64::from(t) * 1_000_000_000)),
        mtime: a.mtime.map(|t| TimeSet::At(i64::from(t) * 1_000_000_000)),
    }
}

/// Resolves a path from the session's root directory `root` (the namespace root, or the
/// user's chroot), following symlinks in every component but the last (and in the last too
/// when `follow_last`). `..` is the parent of the directory reached so far, symlinks
/// followed, as on POSIX systems and OpenSSH's server. Targets resolve inside the root like
/// any path: `..` stops at the root and an absolute target starts from it, so no path leads
/// out.
fn walk(engine: &Engine, caller: &Caller, root: Ino, path: &str, follow_last: bool) -> Result<Attr, Error> {
    walk_names(engine, caller, root, path, follow_last, false).map(|(a, _)| a.expect("found: a missing last name is an error here"))
}

/// [`walk`], also giving the names of the path reached from the root, symlinks resolved (what
/// `realpath` answers). With `missing_last_ok`, a last component that does not exist ends the
/// walk with no entry and its name last, as OpenSSH's realpath allows.
fn walk_names(engine: &Engine, caller: &Caller, root: Ino, path: &str, follow_last: bool, missing_last_ok: bool) -> Result<(Option<Attr>, Vec<String>), Error> {
    let mut pending: Vec<String> = steps(path).map(str::to_string).collect();
    pending.reverse();
    let mut stack: Vec<(Attr, String)> = vec![(engine.getattr(caller, root)?, String::new())];
    let names = |stack: &[(Attr, String)]| stack[1..].iter().map(|(_, n)| n.clone()).collect::<Vec<_>>();
    let mut hops = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let dir = &stack.last().expect("the root is always on the stack").0;
        if dir.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        let last = pending.is_empty();
        let a = match engine.lookup(caller, dir.ino, name.as_bytes()) {
            Ok(a) => a,
            Err(Error::NotFound) if last && missing_last_ok => {
                let mut n = names(&stack);
                n.push(name);
                return Ok((None, n));
            }
            Err(e) => return Err(e),
        };
        if a.kind == FileKind::Symlink && (!last || follow_last) {
            hops += 1;
            if hops > SYMLINK_HOPS_MAX {
                return Err(Error::InvalidArgument("too many levels of symbolic links".into()));
            }
            let target = String::from_utf8_lossy(&engine.readlink(caller, a.ino)?).into_owned();
            if target.starts_with('/') {
                stack.truncate(1);
            }
            // `..` in a target is kept for the walk above, which stops at the root.
            for c in steps(&target).collect::<Vec<_>>().into_iter().rev() {
                pending.push(c.to_string());
            }
            continue;
        }
        stack.push((a, name));
    }
    let n = names(&stack);
    Ok((Some(stack.pop().expect("the root is always on the stack").0), n))
}

impl SftpSession {
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &Caller, Ino) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, StatusCode> {
        let (engine, caller, root) = (self.engine.clone(), self.caller.clone(), self.root);
        match tokio::task::spawn_blocking(move || f(&engine, &caller, root)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(code(&e)),
            Err(_) => Err(StatusCode::Failure),
        }
    }

    fn add_handle(&mut self, open: Open) -> Result<String, StatusCode> {
        if self.handles.len() >= HANDLES_MAX {
            return Err(StatusCode::Failure);
        }
        self.next_handle += 1;
        let h = format!("h{}", self.next_handle);
        self.handles.insert(h.clone(), open);
        Ok(h)
    }

    /// The reply to READ `id`: at most `len` bytes of the file at `offset` as SSH_FXP_DATA, or
    /// the status that says why not (EOF at or past the end).
    pub(crate) async fn read_reply(&mut self, id: u32, handle: &str, offset: u64, len: u32) -> Vec<Bytes> {
        match self.read_packet(id, handle, offset, len).await {
            Ok(p) => p,
            Err(code) => vec![crate::serve::encode(Packet::error(id, code))],
        }
    }

    async fn read_packet(&mut self, id: u32, handle: &str, offset: u64, len: u32) -> Result<Vec<Bytes>, StatusCode> {
        let (ino, _) = self.file_for(handle, Use::Read)?;
        let len = len.min(READ_BYTES_MAX) as usize;
        let (packet, n) = match self.read_ahead(id, handle, ino, offset, len).await {
            Some(p) => (p, len),
            None => {
                let pieces = self.run(move |e, c, _| e.read_shared(c, ino, offset, len)).await?;
                let n = pieces.iter().map(|p| p.len()).sum::<usize>().min(len);
                (data_reply(id, &pieces, 0, n), n)
            }
        };
        if n == 0 && len > 0 {
            return Err(StatusCode::Eof);
        }
        let st = self.ahead.entry(handle.to_string()).or_insert(SeqRead { next: u64::MAX, current: None, pending: None });
        st.next = offset + n as u64;
        Ok(packet)
    }

    /// Serves `[offset, offset + len)` from the handle's readahead window as the reply to READ
    /// `id`, and starts reading the next window when the handle is read sequentially. `None`:
    /// read directly.
    async fn read_ahead(&mut self, id: u32, handle: &str, ino: Ino, offset: u64, len: usize) -> Option<Vec<Bytes>> {
        let st = self.ahead.get_mut(handle)?;
        if st.next != offset {
            st.current = None;
            if let Some((_, p)) = st.pending.take() {
                p.abort();
            }
            return None;
        }
        let covers = |w: &Window| w.0 <= offset && offset + len as u64 <= w.0 + window_len(w) as u64;
        if !st.current.as_ref().is_some_and(covers) {
            st.current = None;
            // The window read in the background, if it is the one this READ needs.
            if let Some((start, p)) = st.pending.take() {
                if start == offset {
                    if let Ok(Ok(w)) = p.await {
                        st.current = Some(w);
                    }
                } else {
                    p.abort();
                }
            }
            let fresh = match &st.current {
                Some(w) => {
                    let (engine, caller, stamp) = (self.engine.clone(), self.caller.clone(), w.2);
                    let now = tokio::task::spawn_blocking(move || engine.getattr(&caller, ino)).await.ok().and_then(Result::ok);
                    now.is_some_and(|a| (a.size, a.mtime_ns, a.ctime_ns) == stamp)
                }
                None => false,
            };
            let st = self.ahead.get_mut(handle)?;
            if !fresh {
                st.current = None;
            }
            if st.pending.is_none() {
                // After the window in use, or after this READ (read directly) when there is none.
                let next = st.current.as_ref().map_or(offset + len as u64, |w| w.0 + window_len(w) as u64);
                let holding = self.ahead.values().filter(|s| s.current.is_some() || s.pending.is_some()).count();
                let window = if holding <= READAHEAD_HANDLES_LARGE { READAHEAD_BYTES } else { READAHEAD_BYTES_SMALL };
                let st = self.ahead.get_mut(handle)?;
                let (engine, caller) = (self.engine.clone(), self.caller.clone());
                st.pending = Some((
                    next,
                    tokio::task::spawn_blocking(move || {
                        let a = engine.getattr(&caller, ino)?;
                        let data = engine.read_shared(&caller, ino, next, window)?;
                        Ok((next, data, (a.size, a.mtime_ns, a.ctime_ns)))
                    }),
                ));
            }
        }
        let st = self.ahead.get_mut(handle)?;
        let w = st.current.as_ref().filter(|w| covers(w))?;
        let a = (offset - w.0) as usize;
        Some(data_reply(id, &w.1, a, a + len))
    }

    /// WRITE: `data` is a view of the request packet's buffer (`serve::run` reads WRITEs in
    /// place), or the data russh-sftp decoded.
    pub(crate) async fn write_bytes(&mut self, id: u32, handle: &str, offset: u64, data: Bytes) -> Result<Status, StatusCode> {
        let (ino, append) = self.file_for(handle, Use::Write)?;
        self.ahead.clear();
        // Most writes only add to the file's write buffer: done here, without a trip to a
        // blocking thread per request (that trip cost more than the write).
        // The handle was opened for writing (an existing file only where its mode allowed it),
        // so its owner writes through it whatever the mode is now, as through a descriptor:
        // OpenSSH's `put` of a 0444 file creates the file 0444 in its OPEN and then writes.
        if !append && self.engine.try_write_buffered_as_owner(&self.caller, ino, offset, &data).map_err(|e| code(&e))? {
            return Ok(ok(id));
        }
        self.run(move |e, c, _| {
            let off = if append { e.getattr(c, ino)?.size } else { offset };
            e.write_as_owner(c, ino, off, &data, Stability::Unstable).map(|_| ())
        })
        .await?;
        Ok(ok(id))
    }

    fn file_ino(&self, handle: &str) -> Result<(Ino, bool), StatusCode> {
        self.file_for(handle, Use::Any)
    }

    /// The open file behind `handle`, if it was opened for `u` (a READ through a handle
    /// opened only to write, or a WRITE through one opened to read, is refused as OpenSSH's
    /// server refuses them: its descriptor was opened that way).
    fn file_for(&self, handle: &str, u: Use) -> Result<(Ino, bool), StatusCode> {
        match self.handles.get(handle) {
            Some(Open::File { ino, append, read, write, .. }) => match u {
                Use::Read if !read => Err(StatusCode::PermissionDenied),
                Use::Write if !write => Err(StatusCode::PermissionDenied),
                _ => Ok((*ino, *append)),
            },
            _ => Err(StatusCode::Failure),
        }
    }
}

/// Splits a path into its parent (resolved, following symlinks) and last name.
fn parent_and_name(engine: &Engine, caller: &Caller, root: Ino, path: &str) -> Result<(Attr, String), Error> {
    let mut comps: Vec<&str> = steps(path).collect();
    let name = comps.pop().ok_or_else(|| Error::InvalidArgument("the root has no parent".into()))?;
    if name == ".." {
        return Err(Error::InvalidArgument("a path ending in '..' names no entry to make or change".into()));
    }
    let parent = walk(engine, caller, root, &comps.join("/"), true)?;
    if parent.kind != FileKind::Dir {
        return Err(Error::NotDir);
    }
    Ok((parent, name.to_string()))
}

impl russh_sftp::server::Handler for SftpSession {
    type Error = StatusCode;

    fn unimplemented(&self) -> Self::Error {
        StatusCode::OpUnsupported
    }

    async fn init(&mut self, _version: u32, _extensions: HashMap<String, String>) -> Result<Version, Self::Error> {
        let mut v = Version::new();
        for (name, version) in EXTENSIONS {
            v.extensions.insert(name.into(), version.into());
        }
        Ok(v)
    }

    async fn open(&mut self, id: u32, filename: String, pflags: OpenFlags, attrs: FileAttributes) -> Result<Handle, Self::Error> {
        let mode = attrs.permissions.map_or(0o644, |p| p & 0o7777);
        let create = pflags.contains(OpenFlags::CREATE);
        let exclusive = pflags.contains(OpenFlags::EXCLUDE);
        let truncate = pflags.contains(OpenFlags::TRUNCATE);
        let append = pflags.contains(OpenFlags::APPEND);
        // As OpenSSH's server opens: WRITE alone to write, READ alone (or neither) to read.
        let write = pflags.contains(OpenFlags::WRITE);
        let read = pflags.contains(OpenFlags::READ) || !write;
        let ino = self
            .run(move |e, c, root| {
                let (attr, created) = if create {
                    let (parent, name) = parent_and_name(e, c, root, &filename)?;
                    match e.lookup(c, parent.ino, name.as_bytes()) {
                        Ok(a) if a.kind == FileKind::Symlink && !exclusive => (walk(e, c, root, &filename, true)?, false),
                        Ok(_) if exclusive => return Err(Error::Exists),
                        Ok(a) => (a, false),
                        Err(Error::NotFound) => (e.create(c, parent.ino, name.as_bytes(), mode, exclusive)?, true),
                        Err(err) => return Err(err),
                    }
                } else {
                    (walk(e, c, root, &filename, true)?, false)
                };
                if attr.kind == FileKind::Dir {
                    return Err(Error::IsDir);
                }
                // An existing file is opened only for what its mode allows the caller; a file
                // this OPEN created is its creator's to write whatever mode it was given.
                let need = if read { 4 } else { 0 } | if write || truncate { 2 } else { 0 };
                if !created && e.access(c, attr.ino, need)? != need {
                    return Err(Error::PermissionDenied);
                }
                if truncate && attr.size > 0 {
                    e.setattr(c, attr.ino, SetAttr { size: Some(0), ..Default::default() })?;
                }
                Ok(attr.ino)
            })
            .await?;
        let handle = self.add_handle(Open::File { ino, append, read, write })?;
        Ok(Handle { id, handle })
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        self.ahead.remove(&handle);
        match self.handles.remove(&handle) {
            Some(Open::File { ino, .. }) => {
                self.run(move |e, c, _| e.close(c, ino)).await?;
                Ok(ok(id))
            }
            Some(Open::Dir { .. }) => Ok(ok(id)),
            None => Err(StatusCode::Failure),
        }
    }

    // READ is served by `serve::run` (`SftpSession::read_reply`), which builds the reply from
    // the bytes the engine read.

    async fn write(&mut self, id: u32, handle: String, offset: u64, data: Vec<u8>) -> Result<Status, Self::Error> {
        self.write_bytes(id, &handle, offset, Bytes::from(data)).await
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let a = self.run(move |e, c, root| walk(e, c, root, &path, false)).await?;
        Ok(Attrs { id, attrs: attrs_of(&a) })
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let a = self.run(move |e, c, root| walk(e, c, root, &path, true)).await?;
        Ok(Attrs { id, attrs: attrs_of(&a) })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        let ino = match self.handles.get(&handle) {
            Some(Open::File { ino, .. }) | Some(Open::Dir { ino, .. }) => *ino,
            None => return Err(StatusCode::Failure),
        };
        let a = self.run(move |e, c, _| e.getattr(c, ino)).await?;
        Ok(Attrs { id, attrs: attrs_of(&a) })
    }

    async fn setstat(&mut self, id: u32, path: String, attrs: FileAttributes) -> Result<Status, Self::Error> {
        let set = setattr_of(&attrs);
        self.run(move |e, c, root| {
            let a = walk(e, c, root, &path, true)?;
            e.setattr(c, a.ino, set).map(|_| ())
        })
        .await?;
        Ok(ok(id))
    }

    async fn fsetstat(&mut self, id: u32, handle: String, attrs: FileAttributes) -> Result<Status, Self::Error> {
        let (ino, _) = self.file_ino(&handle)?;
        // A handle opened to write resizes its file for the owner whatever the mode is by
        // then, as `ftruncate` on OpenSSH's descriptor (as its WRITEs, `write_as_owner`).
        let as_owner = self.file_for(&handle, Use::Write).is_ok();
        let set = setattr_of(&attrs);
        self.run(move |e, c, _| if as_owner { e.setattr_as_owner(c, ino, set) } else { e.setattr(c, ino, set) }.map(|_| ())).await?;
        Ok(ok(id))
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        let a = self.run(move |e, c, root| walk(e, c, root, &path, true)).await?;
        if a.kind != FileKind::Dir {
            return Err(StatusCode::Failure);
        }
        let handle = self.add_handle(Open::Dir { ino: a.ino, cursor: None, done: false })?;
        Ok(Handle { id, handle })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        let (ino, cursor) = match self.handles.get(&handle) {
            Some(Open::Dir { done: true, .. }) => return Err(StatusCode::Eof),
            Some(Open::Dir { ino, cursor, .. }) => (*ino, cursor.clone()),
            _ => return Err(StatusCode::Failure),
        };
        let (entries, next) = self
            .run(move |e, c, _| {
                let page = e.readdir(c, ino, cursor.as_deref(), READDIR_ENTRIES)?;
                let mut out = Vec::with_capacity(page.entries.len());
                let mut names = OwnerNames::default();
                let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
                for d in page.entries {
                    if let Ok(a) = e.getattr(c, d.ino) {
                        let name = String::from_utf8_lossy(&d.name).into_owned();
                        let (user, group) = names.shown(e, &a);
                        let longname = longname(&name, &a, &user, &group, now_s);
                        out.push(File { longname, filename: name, attrs: attrs_of(&a) });
                    }
                }
                Ok((out, page.next_cursor))
            })
            .await?;
        if let Some(Open::Dir { cursor, done, .. }) = self.handles.get_mut(&handle) {
            *done = next.is_none();
            *cursor = next;
        }
        if entries.is_empty() {
            return Err(StatusCode::Eof);
        }
        Ok(Name { id, files: entries })
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        self.run(move |e, c, root| {
            let (p, n) = parent_and_name(e, c, root, &filename)?;
            e.unlink(c, p.ino, n.as_bytes())
        })
        .await?;
        Ok(ok(id))
    }

    async fn mkdir(&mut self, id: u32, path: String, attrs: FileAttributes) -> Result<Status, Self::Error> {
        let mode = attrs.permissions.map_or(0o755, |p| p & 0o7777);
        self.run(move |e, c, root| {
            let (p, n) = parent_and_name(e, c, root, &path)?;
            e.mkdir(c, p.ino, n.as_bytes(), mode).map(|_| ())
        })
        .await?;
        Ok(ok(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        self.run(move |e, c, root| {
            let (p, n) = parent_and_name(e, c, root, &path)?;
            e.rmdir(c, p.ino, n.as_bytes())
        })
        .await?;
        Ok(ok(id))
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        // As OpenSSH's server: symlinks resolved, `..` after them, a last name that does
        // not exist kept (a client asks before it creates), anything else missing an error.
        let (_, names) = self.run(move |e, c, root| walk_names(e, c, root, &path, true, true)).await?;
        Ok(Name { id, files: vec![File::dummy(format!("/{}", names.join("/")))] })
    }

    /// SFTP v3 RENAME does not replace an existing target (draft-ietf-secsh-filexfer-02 §6.5).
    async fn rename(&mut self, id: u32, oldpath: String, newpath: String) -> Result<Status, Self::Error> {
        self.run(move |e, c, root| {
            let (fp, fname) = parent_and_name(e, c, root, &oldpath)?;
            let (tp, tname) = parent_and_name(e, c, root, &newpath)?;
            match e.lookup(c, tp.ino, tname.as_bytes()) {
                Ok(_) => return Err(Error::Exists),
                Err(Error::NotFound) => {}
                Err(err) => return Err(err),
            }
            e.rename(c, fp.ino, fname.as_bytes(), tp.ino, tname.as_bytes())
        })
        .await?;
        Ok(ok(id))
    }

    async fn readlink(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let t = self
            .run(move |e, c, root| {
                let a = walk(e, c, root, &path, false)?;
                e.readlink(c, a.ino)
            })
            .await?;
        Ok(Name { id, files: vec![File::dummy(String::from_utf8_lossy(&t).into_owned())] })
    }

    /// OpenSSH's client (and paramiko) send the target first and the new link's path second,
    /// the reverse of the draft; russh-sftp names the fields in the draft's order.
    async fn symlink(&mut self, id: u32, linkpath: String, targetpath: String) -> Result<Status, Self::Error> {
        let (target, link) = (linkpath, targetpath);
        self.run(move |e, c, root| {
            let (p, n) = parent_and_name(e, c, root, &link)?;
            e.symlink(c, p.ino, n.as_bytes(), target.as_bytes()).map(|_| ())
        })
        .await?;
        Ok(ok(id))
    }

    async fn extended(&mut self, id: u32, request: String, data: Vec<u8>) -> Result<Packet, Self::Error> {
        match request.as_str() {
            "fsync@openssh.com" => {
                let [handle] = ssh_strings::<1>(&data)?;
                let (ino, _) = self.file_ino(&handle)?;
                self.run(move |e, c, _| e.commit(c, ino)).await?;
                Ok(Packet::from(ok(id)))
            }
            // Rename that replaces an existing target, atomically (the engine's rename does).
            "posix-rename@openssh.com" => {
                let [from, to] = ssh_strings::<2>(&data)?;
                self.run(move |e, c, root| {
                    let (fp, fname) = parent_and_name(e, c, root, &from)?;
                    let (tp, tname) = parent_and_name(e, c, root, &to)?;
                    e.rename(c, fp.ino, fname.as_bytes(), tp.ino, tname.as_bytes())
                })
                .await?;
                Ok(Packet::from(ok(id)))
            }
            "hardlink@openssh.com" => {
                let [existing, link] = ssh_strings::<2>(&data)?;
                self.run(move |e, c, root| {
                    let a = walk(e, c, root, &existing, false)?;
                    if a.kind == FileKind::Dir {
                        return Err(Error::IsDir);
                    }
                    let (p, n) = parent_and_name(e, c, root, &link)?;
                    e.link(c, a.ino, p.ino, n.as_bytes()).map(|_| ())
                })
                .await?;
                Ok(Packet::from(ok(id)))
            }
            "statvfs@openssh.com" => {
                let [path] = ssh_strings::<1>(&data)?;
                let data = self
                    .run(move |e, c, root| {
                        walk(e, c, root, &path, true)?;
                        e.statfs(c)
                    })
                    .await
                    .map(|s| statvfs_reply(&s))?;
                Ok(Packet::ExtendedReply(ExtendedReply { id, data }))
            }
            "fstatvfs@openssh.com" => {
                let [handle] = ssh_strings::<1>(&data)?;
                if !self.handles.contains_key(&handle) {
                    return Err(StatusCode::Failure);
                }
                let data = self.run(|e, c, _| e.statfs(c)).await.map(|s| statvfs_reply(&s))?;
                Ok(Packet::ExtendedReply(ExtendedReply { id, data }))
            }
            "limits@openssh.com" => Ok(Packet::ExtendedReply(ExtendedReply { id, data: limits_reply() })),
            // Names for owner and group ids (OpenSSH's client asks for those of a listing it
            // prints with `ls -l`); an id without a name gets an empty one.
            "users-groups-by-id@openssh.com" => {
                let (uids, gids) = ids_args(&data)?;
                let data = self
                    .run(move |e, _, _| {
                        let mut names = OwnerNames::default();
                        let users: Vec<String> = uids.iter().map(|&u| names.user(e, u).unwrap_or_default().to_owned()).collect();
                        let groups: Vec<String> = gids.iter().map(|&g| names.group(e, g).unwrap_or_default().to_owned()).collect();
                        Ok(names_reply(&users, &groups))
                    })
                    .await?;
                Ok(Packet::ExtendedReply(ExtendedReply { id, data }))
            }
            // Server-side copy (OpenSSH's `cp`): the bytes go from one handle's file to the
            // other's in the engine, never through the client.
            "copy-data" => {
                let (from, read_at, len, to, write_at) = copy_data_args(&data)?;
                let (src, _) = self.file_for(&from, Use::Read)?;
                let (dst, append) = self.file_for(&to, Use::Write)?;
                let end = if len == 0 { u64::MAX } else { read_at.checked_add(len).ok_or(StatusCode::Failure)? };
                // As OpenSSH's server: one file's range copied onto itself where it overlaps
                // is refused.
                if src == dst && read_at < write_at.saturating_add(end - read_at) && write_at < end {
                    return Err(StatusCode::Failure);
                }
                self.ahead.clear();
                self.run(move |e, c, _| {
                    let mut at = read_at;
                    let mut out = if append { e.getattr(c, dst)?.size } else { write_at };
                    while at < end {
                        let want = (end - at).min(COPY_PIECE_BYTES as u64) as usize;
                        let pieces = e.read_shared(c, src, at, want)?;
                        let got: usize = pieces.iter().map(|p| p.len()).sum::<usize>().min(want);
                        if got == 0 {
                            break;
                        }
                        let mut buf = Vec::with_capacity(got);
                        for p in &pieces {
                            buf.extend_from_slice(&p[..p.len().min(got - buf.len())]);
                        }
                        e.write_as_owner(c, dst, out, &buf, Stability::Unstable)?;
                        at += got as u64;
                        out += got as u64;
                    }
                    Ok(())
                })
                .await?;
                Ok(Packet::from(ok(id)))
            }
            _ => Err(StatusCode::OpUnsupported),
        }
    }
}

/// The limits@openssh.com reply: four u64 (largest packet, read and write lengths, open
/// handles), as OpenSSH's PROTOCOL file describes.
fn limits_reply() -> Vec<u8> {
    [CLIENT_PACKET_BYTES_MAX, TRANSFER_BYTES_OFFERED, TRANSFER_BYTES_OFFERED, HANDLES_MAX as u64]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect()
}

/// Extensions offered in the VERSION reply (name, version), as OpenSSH's sftp-server names
/// them; its client uses each only when offered.
const EXTENSIONS: [(&str, &str); 8] = [
    ("posix-rename@openssh.com", "1"),
    ("limits@openssh.com", "1"),
    ("statvfs@openssh.com", "2"),
    ("fstatvfs@openssh.com", "2"),
    ("hardlink@openssh.com", "1"),
    ("fsync@openssh.com", "1"),
    ("copy-data", "1"),
    ("users-groups-by-id@openssh.com", "1"),
];

/// Bytes a `copy-data` request moves per engine read and write.
const COPY_PIECE_BYTES: usize = 4 << 20;

/// Block size reported by statvfs (the unit of its block counts).
const STATVFS_BLOCK_BYTES: u64 = 4096;

/// The statvfs@openssh.com reply: eleven u64 (bsize, frsize, blocks, bfree, bavail, files,
/// ffree, favail, fsid, flag, namemax). The engine has no inode table to run out of; free
/// inodes are counted as free 4 KiB blocks, as NFS FSSTAT does.
fn statvfs_reply(s: &StatFs) -> Vec<u8> {
    let free_blocks = s.free_bytes / STATVFS_BLOCK_BYTES;
    let fields = [
        STATVFS_BLOCK_BYTES,
        STATVFS_BLOCK_BYTES,
        s.total_bytes / STATVFS_BLOCK_BYTES,
        free_blocks,
        free_blocks,
        s.files.saturating_add(free_blocks),
        free_blocks,
        free_blocks,
        0,
        0,
        u64::from(s.name_bytes_max),
    ];
    fields.iter().flat_map(|f| f.to_be_bytes()).collect()
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_lines_read_as_openssh_writes_them() {
        let now = 1_765_110_000; // 2025-12-07 12:20:00 UTC
        assert_eq!(ls_time(now - 3600, now), "Dec  7 11:20");
        assert_eq!(ls_time(981_201_600, now), "Feb  3  2001");
        assert_eq!(ls_time(now + 3600, now), "Dec  7  2025", "a time ahead shows its year");
        assert_eq!(ls_time(now - 200 * 86_400, now), "May 21  2025", "over six months ago");
        let attr = |kind, mode, nlink, size, mtime_ns| Attr {
            ino: 9,
            kind,
            mode,
            uid: 1000,
            gid: 100,
            nlink,
            size,
            atime_ns: 0,
            mtime_ns,
            ctime_ns: 0,
            btime_ns: 0,
            version: 1,
            generation: 1,
            stored_bytes: size,
            rdev: 0,
        };
        let a = attr(FileKind::File, 0o640, 1, 12_345, 981_201_600_000_000_000);
        assert_eq!(longname("data.bin", &a, "alice", "users", now), "-rw-r-----   1 alice    users       12345 Feb  3  2001 data.bin");
        let d = attr(FileKind::Dir, 0o1777, 3, 0, (now - 60) * 1_000_000_000);
        assert_eq!(longname("tmp", &d, "4242", "a-long-group-name", now), "drwxrwxrwt   3 4242     a-long-group-name        0 Dec  7 12:19 tmp");
        let s = attr(FileKind::File, 0o6644, 1, 0, 0);
        assert!(longname("s", &s, "u", "g", now).starts_with("-rwSr-Sr-- "), "{}", longname("s", &s, "u", "g", now));
    }
}
