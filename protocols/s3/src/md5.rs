//! MD5 for ETags and Content-MD5. [`Md5`] hashes one buffer (small PUTs, copies, parts'
//! MD5s): OpenSSL's assembly MD5, about twice the portable Rust one here (≈840 against
//! ≈465 MiB/s on one core of the development VM); where OpenSSL refuses MD5 (a FIPS-only
//! configuration), the portable implementation. [`StreamMd5`] hashes streamed upload bodies
//! on one thread shared by all uploads, in SIMD lanes while several are in flight.

use md5::Digest;
use openssl::hash::{Hasher, MessageDigest};

pub(crate) enum Md5 {
    OpenSsl(Hasher),
    Portable(md5::Md5),
}

impl Md5 {
    pub(crate) fn new() -> Md5 {
        match Hasher::new(MessageDigest::md5()) {
            Ok(h) => Md5::OpenSsl(h),
            Err(_) => Md5::Portable(md5::Md5::new()),
        }
    }

    pub(crate) fn update(&mut self, data: impl AsRef<[u8]>) {
        match self {
            // Updating an initialised MD5 context only hashes memory; it has no failure mode.
            Md5::OpenSsl(h) => h.update(data.as_ref()).expect("OpenSSL MD5 update"),
            Md5::Portable(h) => h.update(data.as_ref()),
        }
    }

    pub(crate) fn finalize(self) -> [u8; 16] {
        match self {
            Md5::OpenSsl(mut h) => {
                let d = h.finish().expect("OpenSSL MD5 finish");
                let mut out = [0u8; 16];
                out.copy_from_slice(&d);
                out
            }
            Md5::Portable(h) => h.finalize().into(),
        }
    }

    /// The MD5 of `data`, in one go.
    pub(crate) fn digest(data: impl AsRef<[u8]>) -> [u8; 16] {
        let mut h = Md5::new();
        h.update(data);
        h.finalize()
    }
}

/// The MD5 of an upload's body, hashed chunk by chunk on one hashing thread shared by all
/// uploads. One MD5 is serial (each 64-byte block depends on the one before), but
/// independent uploads are not: whenever three or more uploads have chunks waiting, the
/// thread hashes one chunk of each side by side in the SIMD lanes of a multi-buffer MD5
/// (`md5-many`; 8 lanes, or 16 with AVX-512), about three times a core's serial speed on
/// the development VM with 8 lanes full. Chunks queue per upload, so the lanes fill by
/// themselves exactly when hashing is the bottleneck; an upload with [`BACKLOG_MAX`]
/// chunks waiting blocks in [`StreamMd5::update`] until one is hashed, which bounds the
/// memory held. While it hashes one or two uploads, each alone, the thread runs at a raised
/// priority ([`Priority`]).
pub(crate) struct StreamMd5 {
    id: u64,
    backlog: std::sync::Arc<Backlog>,
    finished: bool,
}

/// A chunk of an upload's body, shared with the write that stores it.
pub(crate) type Chunk = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

fn bytes(c: &Chunk) -> &[u8] {
    (**c).as_ref()
}

/// Chunks an upload may have waiting to be hashed.
pub(crate) const BACKLOG_MAX: usize = 2;

/// Chunks hashed in shared lanes (beside at least two other uploads') since the start.
pub(crate) static LANE_SHARED_CHUNKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[derive(Default)]
struct Backlog {
    waiting: std::sync::Mutex<usize>,
    hashed: std::sync::Condvar,
}

enum LaneMsg {
    Chunk(u64, std::sync::Arc<Backlog>, Chunk),
    Finish(u64, std::sync::mpsc::SyncSender<[u8; 16]>),
    Drop(u64),
}

struct Lanes {
    tx: std::sync::Mutex<std::sync::mpsc::Sender<LaneMsg>>,
    next_id: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct LaneStream {
    state: md5_many::Md5State,
    /// Bytes hashed so far: lanes take a state only at a block boundary.
    bytes: u64,
    queue: std::collections::VecDeque<(std::sync::Arc<Backlog>, Chunk)>,
    finish: Option<std::sync::mpsc::SyncSender<[u8; 16]>>,
}

fn lanes() -> &'static Lanes {
    static LANES: std::sync::OnceLock<Lanes> = std::sync::OnceLock::new();
    LANES.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<LaneMsg>();
        std::thread::Builder::new().name("aquifer-md5".into()).spawn(move || lane_thread(rx)).expect("spawn the MD5 lanes thread");
        Lanes { tx: std::sync::Mutex::new(tx), next_id: Default::default() }
    })
}

/// Uploads with chunks waiting that the hashing thread hashes side by side in lanes; fewer
/// are hashed one after the other.
const SHARED_MIN: usize = 3;

/// How far the hashing thread lowers its nice value (raises its priority) below the one it
/// started with, the daemon's, while it hashes uploads alone.
const HASH_NICE: i32 = -10;

/// The hashing thread's priority: raised while fewer than [`SHARED_MIN`] uploads are in
/// flight (each is hashed alone), the default while uploads share its lanes.
///
/// An upload hashed alone goes no faster than one core's MD5, and everything else it needs
/// (receiving, erasure coding, drive writes) runs on other threads with slack between them
/// (the write buffer, the hashing backlog). With the cores busy the kernel shares them out
/// evenly, and a one-stream PUT's hashing thread waited for a core for about a tenth of its
/// time (docs/benchmarks.md). With lanes shared, hashing costs a third as much a byte and is
/// no longer what uploads wait for; raised then, the thread took the cores from the
/// threads that feed it and eight-stream PUTs slowed down. Raising a priority takes
/// CAP_SYS_NICE (the appliance runs as root); without it the thread keeps the default.
struct Priority {
    tid: libc::id_t,
    /// The nice value the thread started with (the daemon's, as an operator may have set it):
    /// the default it goes back to.
    base: i32,
    /// False once the kernel refused a raise: the thread then stays at the default.
    allowed: bool,
    raised: bool,
}

impl Priority {
    fn of_this_thread() -> Priority {
        let tid = this_tid();
        Priority { tid, base: nice_of(tid).unwrap_or(0), allowed: true, raised: false }
    }

    /// Raised while fewer than [`SHARED_MIN`] uploads are in flight (see the type), else the
    /// default.
    fn set_for(&mut self, uploads: usize) {
        let raise = uploads < SHARED_MIN;
        if !self.allowed || raise == self.raised {
            return;
        }
        let nice = if raise { raised_nice(self.base) } else { self.base };
        // SAFETY: setpriority on this thread's own id changes only its nice value.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, self.tid, nice) } == 0 {
            self.raised = raise;
        } else {
            tracing::debug!("the MD5 thread keeps the default priority: {}", std::io::Error::last_os_error());
            self.allowed = false;
        }
    }
}

/// The nice value [`HASH_NICE`] below `base`, within the kernel's range.
fn raised_nice(base: i32) -> i32 {
    (base + HASH_NICE).max(-20)
}

/// The calling thread's id.
fn this_tid() -> libc::id_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::id_t }
}

/// The nice value of thread `tid` of this process.
fn nice_of(tid: libc::id_t) -> Option<i32> {
    // getpriority answers -1 both for a nice value of -1 and for an error; errno tells them
    // apart. SAFETY: errno is this thread's own; getpriority only reads.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
        (nice != -1 || *libc::__errno_location() == 0).then_some(nice)
    }
}

fn lane_thread(rx: std::sync::mpsc::Receiver<LaneMsg>) {
    use std::collections::HashMap;
    let engine = md5_many::Md5Many::new();
    // The multi-buffer kernels are fast with their lanes full and slow with some empty:
    // rounds are 8 or 16 lanes, empty ones given a dummy stream.
    let wide = if engine.lanes() >= 16 { 16 } else { 8 };
    let mut streams: HashMap<u64, LaneStream> = HashMap::new();
    let mut dummies = vec![md5_many::Md5State::new(); 16];
    let mut filler: Vec<u8> = Vec::new();
    let mut priority = Priority::of_this_thread();
    let take = |m: LaneMsg, streams: &mut HashMap<u64, LaneStream>| match m {
        LaneMsg::Chunk(id, b, d) => streams.entry(id).or_default().queue.push_back((b, d)),
        LaneMsg::Finish(id, reply) => streams.entry(id).or_default().finish = Some(reply),
        LaneMsg::Drop(id) => {
            if let Some(s) = streams.remove(&id) {
                for (b, _) in s.queue {
                    b.done();
                }
            }
        }
    };
    // When the current gathering of chunks for a round began.
    let mut gathering: Option<std::time::Instant> = None;
    loop {
        if streams.values().all(|s| s.queue.is_empty()) {
            match rx.recv() {
                Ok(m) => take(m, &mut streams),
                Err(_) => return,
            }
        }
        while let Ok(m) = rx.try_recv() {
            take(m, &mut streams);
        }
        if let Some(wait) = gather_wait(&streams, wide, &mut gathering) {
            match rx.recv_timeout(wait) {
                Ok(m) => take(m, &mut streams),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
            continue;
        }
        gathering = None;
        priority.set_for(streams.len());
        // One round: the head chunk of every upload that has one.
        let mut ids: Vec<u64> = streams.iter().filter(|(_, s)| !s.queue.is_empty()).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        // Lanes take equal lengths; a different one (an upload's last chunk) hashes alone.
        let len = ids.iter().map(|id| bytes(&streams[id].queue[0].1).len()).max().unwrap_or(0);
        let (lane_ids, alone): (Vec<u64>, Vec<u64>) = ids.into_iter().partition(|id| bytes(&streams[id].queue[0].1).len() == len && len % 64 == 0 && streams[id].bytes % 64 == 0);
        let (lane_ids, alone) = if lane_ids.len() >= SHARED_MIN { (lane_ids, alone) } else { (Vec::new(), lane_ids.into_iter().chain(alone).collect()) };
        for group in lane_ids.chunks(wide) {
            let n = if group.len() > 8 { 16 } else { 8 };
            if filler.len() < len {
                filler.resize(len, 0);
            }
            let mut states: Vec<md5_many::Md5State> = group.iter().map(|id| streams[id].state).collect();
            states.extend_from_slice(&dummies[..n - group.len()]);
            let mut inputs: Vec<&[u8]> = group.iter().map(|id| bytes(&streams[id].queue[0].1)).collect();
            inputs.resize(n, &filler[..len]);
            engine.update_many(&mut states, &inputs);
            drop(inputs);
            for (id, st) in group.iter().zip(states) {
                streams.get_mut(id).expect("a stream of this round").state = st;
            }
            dummies.iter_mut().for_each(|d| *d = md5_many::Md5State::new());
            LANE_SHARED_CHUNKS.fetch_add(group.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        for id in &alone {
            let s = streams.get_mut(id).expect("a stream of this round");
            let data = s.queue[0].1.clone();
            s.state.update(bytes(&data));
        }
        for id in lane_ids.iter().chain(&alone) {
            let s = streams.get_mut(id).expect("a stream of this round");
            let (b, d) = s.queue.pop_front().expect("the head just hashed");
            s.bytes += bytes(&d).len() as u64;
            b.done();
        }
        // Uploads whose last chunk is hashed get their digest.
        streams.retain(|_, s| {
            if s.queue.is_empty()
                && let Some(reply) = s.finish.take()
            {
                let _ = reply.send(s.state.finalize());
                return false;
            }
            true
        });
    }
}

/// Longest a round waits for more uploads' chunks (see [`gather_wait`]).
const GATHER_MAX: std::time::Duration = std::time::Duration::from_millis(8);

/// How long to wait for more chunks before the next round, or `None` to hash now.
///
/// With three or more uploads under way, a round waits until as many of them as fill the
/// lanes have a chunk ready: a chunk in a full round of 8 lanes costs about a third of the CPU
/// of one hashed alone, and on a small machine CPU, not the time a chunk waits, bounds
/// concurrent uploads (a profile of eight 64 MiB PUTs had a fifth of the daemon's CPU in
/// chunks hashed alone as they arrived one by one). It never waits when an upload's digest
/// is asked for, when an upload has [`BACKLOG_MAX`] chunks waiting (it is blocked), or past
/// [`GATHER_MAX`] since the gathering began.
fn gather_wait(streams: &std::collections::HashMap<u64, LaneStream>, wide: usize, gathering: &mut Option<std::time::Instant>) -> Option<std::time::Duration> {
    let active = streams.len();
    let ready = streams.values().filter(|s| !s.queue.is_empty()).count();
    if active < SHARED_MIN || ready >= active.min(wide) || streams.values().any(|s| s.finish.is_some() || s.queue.len() >= BACKLOG_MAX) {
        return None;
    }
    let began = *gathering.get_or_insert_with(std::time::Instant::now);
    GATHER_MAX.checked_sub(began.elapsed()).filter(|d| !d.is_zero())
}

impl Backlog {
    fn done(&self) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        *w = w.saturating_sub(1);
        self.hashed.notify_all();
    }
}

impl StreamMd5 {
    pub(crate) fn new() -> StreamMd5 {
        let id = lanes().next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        StreamMd5 { id, backlog: Default::default(), finished: false }
    }

    /// False only if the hashing thread is gone (it does not end while the process runs).
    fn send(&self, m: LaneMsg) -> bool {
        let tx = lanes().tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.send(m).is_ok()
    }

    /// Queues a chunk for hashing; blocks while [`BACKLOG_MAX`] chunks of this upload are
    /// waiting. Call it where blocking is allowed.
    pub(crate) fn update(&mut self, data: Chunk) {
        if bytes(&data).is_empty() {
            return;
        }
        {
            let mut w = self.backlog.waiting.lock().unwrap_or_else(|e| e.into_inner());
            while *w >= BACKLOG_MAX {
                w = self.backlog.hashed.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            *w += 1;
        }
        assert!(self.send(LaneMsg::Chunk(self.id, self.backlog.clone(), data)), "the MD5 lanes thread runs for the life of the process");
    }

    /// The digest, once every chunk is hashed. Blocks.
    pub(crate) fn finalize(mut self) -> [u8; 16] {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.finished = true;
        assert!(self.send(LaneMsg::Finish(self.id, reply)), "the MD5 lanes thread runs for the life of the process");
        answer.recv().expect("the MD5 lanes thread answers every upload it was given")
    }
}

impl Drop for StreamMd5 {
    fn drop(&mut self) {
        if !self.finished {
            // Nothing to tell a hashing thread that is gone.
            let _ = self.send(LaneMsg::Drop(self.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id of this process's thread named `name`.
    fn thread_named(name: &str) -> Option<libc::id_t> {
        std::fs::read_dir("/proc/self/task").unwrap().find_map(|t| {
            let dir = t.ok()?.path();
            (std::fs::read_to_string(dir.join("comm")).ok()?.trim() == name).then(|| dir.file_name()?.to_str()?.parse().ok()).flatten()
        })
    }

    /// Whether this process may raise a thread's priority (root with CAP_SYS_NICE), asked of
    /// a scratch thread (which starts at the nice value of the thread that spawns it).
    fn may_raise() -> bool {
        std::thread::spawn(|| {
            let tid = this_tid();
            // SAFETY: as in `Priority::set_for`, on this scratch thread's own id.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, raised_nice(nice_of(tid).unwrap())) == 0 }
        })
        .join()
        .unwrap()
    }

    /// This thread's nice value.
    fn my_nice() -> i32 {
        nice_of(this_tid()).unwrap()
    }

    /// Raised for one or two uploads, back to the nice value it started with once three
    /// share the lanes, and raised again when they are down to two; starting from a nice
    /// value of 5 (an operator's), raised to -5 and back to 5.
    #[test]
    fn priority_follows_the_uploads_in_flight() {
        let allowed = may_raise();
        std::thread::spawn(move || {
            // Lowering one's own priority needs no privilege. SAFETY: on this thread's own id.
            assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, this_tid(), my_nice().max(5)) }, 0);
            let base = my_nice();
            let raised = if allowed { base + HASH_NICE } else { base };
            let mut p = Priority::of_this_thread();
            for (uploads, want) in [(1, raised), (2, raised), (3, base), (8, base), (2, raised), (0, raised)] {
                p.set_for(uploads);
                assert_eq!(my_nice(), want, "{uploads} uploads in flight");
            }
        })
        .join()
        .unwrap();
    }

    /// The hashing thread hashes an upload alone [`HASH_NICE`] below the process's nice value
    /// where the process may raise priorities (root, as the appliance and CI run), else at it.
    #[test]
    fn the_hashing_thread_runs_ahead_where_allowed() {
        let nice = || nice_of(thread_named("aquifer-md5").expect("the hashing thread is running")).unwrap();
        // The hashing thread starts at the nice value of the test thread that spawned it,
        // this process's.
        let base = my_nice();
        let want = if may_raise() { raised_nice(base) } else { base };
        // Other tests' uploads may share the lanes meanwhile (the default priority); once an
        // upload is hashed alone the thread runs at `want`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let mut h = StreamMd5::new();
            h.update(std::sync::Arc::new(vec![7u8; 4096]) as Chunk);
            assert_eq!(h.finalize(), Md5::digest(vec![7u8; 4096]));
            let now = nice();
            if now == want {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the hashing thread runs at nice {now}, not {want}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    #[test]
    fn matches_the_portable_md5() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let mut a = Md5::new();
        assert!(matches!(a, Md5::OpenSsl(_)), "OpenSSL offers MD5 here");
        for piece in data.chunks(65_537) {
            a.update(piece);
        }
        assert_eq!(a.finalize(), <[u8; 16]>::from(md5::Md5::digest(&data)));
        assert_eq!(hex::encode(Md5::new().finalize()), "d41d8cd98f00b204e9800998ecf8427e");
    }

    /// Uploads hashed at once (so in shared lanes, their chunks of one size) and alone
    /// give OpenSSL's digests, also with chunks that are not whole blocks (which hash
    /// alone) and uploads dropped half-way.
    #[test]
    fn stream_md5_in_lanes_matches_openssl() {
        let before = LANE_SHARED_CHUNKS.load(std::sync::atomic::Ordering::Relaxed);
        let streams: Vec<std::thread::JoinHandle<()>> = (0..12u64)
            .map(|seed| {
                std::thread::spawn(move || {
                    let len = 6_000_000 + seed as usize * 4099;
                    let data: Vec<u8> = (0..len).map(|i| ((i as u64 * 2654435761 + seed * 97) >> 7) as u8).collect();
                    let mut h = StreamMd5::new();
                    // Every third upload starts with a piece that is not a whole block.
                    let mut at = if seed % 3 == 0 { 1000 + seed as usize } else { 0 };
                    if at > 0 {
                        h.update(std::sync::Arc::new(data[..at].to_vec()) as Chunk);
                    }
                    while at < data.len() {
                        let end = (at + (256 << 10)).min(data.len());
                        h.update(std::sync::Arc::new(data[at..end].to_vec()) as Chunk);
                        at = end;
                    }
                    if seed == 5 {
                        // Dropped half-way: the others go on.
                        let mut g = StreamMd5::new();
                        g.update(std::sync::Arc::new(data[..1 << 20].to_vec()) as Chunk);
                        drop(g);
                    }
                    let mut o = Md5::new();
                    o.update(&data);
                    assert_eq!(h.finalize(), o.finalize(), "upload {seed}");
                })
            })
            .collect();
        for s in streams {
            s.join().unwrap();
        }
        assert!(LANE_SHARED_CHUNKS.load(std::sync::atomic::Ordering::Relaxed) > before, "some chunks were hashed in shared lanes");
        assert_eq!(hex::encode(StreamMd5::new().finalize()), "d41d8cd98f00b204e9800998ecf8427e");
    }
}
