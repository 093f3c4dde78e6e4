//! Group commit: callers that need "everything I wrote so far is durable" share one sync
//! instead of each running their own, one after another.
//!
//! A caller takes a ticket, then either finds a sync that started after its ticket already
//! finished (done), waits for the one running, or runs the next one itself for everybody
//! waiting. A sync covers every ticket issued before it started, because each of those
//! callers had finished writing before it took its ticket. A failed sync covers nobody: its
//! leader returns the error and each waiter runs (or waits for) another.

use parking_lot::{Condvar, Mutex};

use crate::error::Result;

#[derive(Default)]
struct State {
    /// The last ticket issued.
    issued: u64,
    /// Every ticket up to this one is covered by a finished sync.
    covered: u64,
    /// A sync is running.
    running: bool,
}

#[derive(Default)]
pub(crate) struct GroupSync {
    state: Mutex<State>,
    finished: Condvar,
}

impl GroupSync {
    /// Returns once a run of `sync` that started after this call began has succeeded;
    /// runs it here if none is running, else waits for the running one (and maybe more).
    pub(crate) fn sync(&self, sync: impl Fn() -> Result<()>) -> Result<()> {
        let mut s = self.state.lock();
        s.issued += 1;
        let ticket = s.issued;
        loop {
            if s.covered >= ticket {
                return Ok(());
            }
            if s.running {
                self.finished.wait(&mut s);
                continue;
            }
            s.running = true;
            let upto = s.issued;
            drop(s);
            let r = sync();
            s = self.state.lock();
            s.running = false;
            if r.is_ok() {
                s.covered = s.covered.max(upto);
            }
            self.finished.notify_all();
            r?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::error::Error;

    /// Each caller's write is covered by the sync it returns after, and concurrent callers
    /// share syncs.
    #[test]
    fn every_caller_is_covered_and_syncs_are_shared() {
        let g = Arc::new(GroupSync::default());
        let written = Arc::new(AtomicU64::new(0));
        let durable = Arc::new(AtomicU64::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (g, written, durable, runs) = (g.clone(), written.clone(), durable.clone(), runs.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let mine = written.fetch_add(1, Ordering::SeqCst) + 1;
                        g.sync(|| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            let upto = written.load(Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(1));
                            durable.fetch_max(upto, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                        assert!(durable.load(Ordering::SeqCst) >= mine, "returned before its write was synced");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let runs = runs.load(Ordering::SeqCst);
        assert!(runs < 400, "{runs} syncs for 400 callers: none shared");
    }

    /// A failed sync covers nobody: its leader sees the error and the waiters sync again.
    #[test]
    fn a_failed_sync_is_not_taken_for_success() {
        let g = Arc::new(GroupSync::default());
        let fail_next = Arc::new(AtomicUsize::new(1));
        let ok_runs = Arc::new(AtomicUsize::new(0));
        let run = {
            let (fail_next, ok_runs) = (fail_next.clone(), ok_runs.clone());
            move || {
                std::thread::sleep(Duration::from_millis(5));
                if fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                    return Err(Error::Io("injected".into()));
                }
                ok_runs.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        };
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (g, run) = (g.clone(), run.clone());
                std::thread::spawn(move || g.sync(&run).is_ok())
            })
            .collect();
        let oks = threads.into_iter().map(|t| t.join().unwrap()).filter(|ok| *ok).count();
        assert_eq!(oks, 3, "exactly the leader of the failed sync sees the error");
        assert!(ok_runs.load(Ordering::SeqCst) >= 1, "the others were covered by a later, successful sync");
    }
}
