//! Sequential readahead for READ.
//!
//! NFS is stateless, so the service keeps a small table per file: where the last READ ended and
//! windows of the file read ahead in the background. A READ that starts where the previous one
//! ended starts reading the next [`WINDOW_BYTES`] ahead; a READ inside a window is served from
//! it and keeps [`WINDOWS_AHEAD`] windows in flight, so the engine's reads overlap the transfer
//! of earlier replies instead of following them.
//!
//! A window is only used while the file's size, mtime and ctime (loaded for every call anyway)
//! are the ones it was read under: any change to the file drops its windows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use storage_engine::{Attr, Caller, Engine, Ino};
use tokio::sync::watch;

/// Bytes read ahead in one engine call.
pub(crate) const WINDOW_BYTES: u64 = 4 << 20;
/// Windows kept in flight ahead of the reader.
const WINDOWS_AHEAD: u64 = 2;
/// Files with readahead state; the least recently used is dropped beyond this.
const FILES_MAX: usize = 32;

type Filled = Option<Option<Arc<Vec<u8>>>>;

struct Window {
    start: u64,
    rx: watch::Receiver<Filled>,
}

struct FileState {
    stamp: (u64, i64, i64),
    /// End of the last READ, for spotting sequential readers.
    last_end: u64,
    windows: Vec<Window>,
    used: u64,
}

/// A file as one caller reads it: windows are read with that caller's permissions and only
/// serve the same identity.
type Key = (Ino, u32, u32, Vec<u32>);

#[derive(Default)]
pub(crate) struct Readahead {
    files: Mutex<(HashMap<Key, FileState>, u64)>,
}

fn stamp(a: &Attr) -> (u64, i64, i64) {
    (a.size, a.mtime_ns, a.ctime_ns)
}

impl Readahead {
    /// Serves `[off, off + count)` of the file `attr` from a window when one covers it, and
    /// schedules windows ahead of a sequential reader. `None`: read it directly.
    pub(crate) async fn read(&self, engine: &Arc<Engine>, caller: &Caller, attr: &Attr, off: u64, count: usize) -> Option<(Arc<Vec<u8>>, std::ops::Range<usize>)> {
        let end = attr.size.min(off.saturating_add(count as u64));
        if off >= end {
            return None;
        }
        let rx = {
            let mut g = self.files.lock().expect("readahead lock");
            let (files, clock) = &mut *g;
            *clock += 1;
            let now = *clock;
            let key: Key = (attr.ino, caller.uid, caller.gid, caller.groups.clone());
            let st = match files.get_mut(&key) {
                Some(st) if st.stamp == stamp(attr) => st,
                _ => {
                    if files.len() >= FILES_MAX {
                        if let Some(old) = files.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| k.clone()) {
                            files.remove(&old);
                        }
                    }
                    files.insert(key.clone(), FileState { stamp: stamp(attr), last_end: u64::MAX, windows: Vec::new(), used: now });
                    files.get_mut(&key).expect("just inserted")
                }
            };
            st.used = now;
            let sequential = st.last_end == off;
            st.last_end = end;
            st.windows.retain(|w| w.start + WINDOW_BYTES > off);
            let hit = st.windows.iter().find(|w| w.start <= off && end <= w.start + WINDOW_BYTES).map(|w| (w.start, w.rx.clone()));
            if hit.is_some() || sequential {
                // Keep windows in flight from the end of this read on.
                let mut next = hit.as_ref().map_or(end, |(s, _)| s + WINDOW_BYTES);
                if let Some(last) = st.windows.last() {
                    next = next.max(last.start + WINDOW_BYTES);
                }
                while next < attr.size && next < end + WINDOWS_AHEAD * WINDOW_BYTES {
                    st.windows.push(Window { start: next, rx: spawn_fill(engine, caller, attr.ino, next) });
                    next += WINDOW_BYTES;
                }
            }
            hit
        };
        let (start, mut rx) = rx?;
        let filled = rx.wait_for(|v| v.is_some()).await.ok()?.clone().flatten()?;
        let a = (off - start) as usize;
        let b = ((end - start) as usize).min(filled.len());
        // The window itself and the range of it to answer with: the reply is encoded straight
        // from the window, without a copy of its own.
        (a < b && b == (end - start) as usize).then_some((filled, a..b))
    }
}

fn spawn_fill(engine: &Arc<Engine>, caller: &Caller, ino: Ino, start: u64) -> watch::Receiver<Filled> {
    let (tx, rx) = watch::channel(None);
    let (engine, caller) = (engine.clone(), caller.clone());
    tokio::task::spawn_blocking(move || {
        let data = engine.read(&caller, ino, start, WINDOW_BYTES as usize).ok().map(Arc::new);
        let _ = tx.send(Some(data));
    });
    rx
}
