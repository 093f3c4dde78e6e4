//! Group commit: callers that need "everything I wrote so far is durable" share one sync
//! instead of each running their own, one after another.
//!
//! A caller takes a ticket, then either finds a sync that started after its ticket already
//! finished (done), waits for the one running, or runs the next one itself for everybody
//! waiting. A sync covers every ticket issued before it started, because each of those
//! callers had finished writing before it took its ticket. A failed sync covers nobody: its
//! leader returns the error and each waiter runs (or waits for) another.
//!
//! Callers on an event loop wait without blocking ([`GroupSync::durable`]): their future is
//! woken by the sync that covers its ticket, which the engine's log-sync thread runs as soon
//! as such a waiter is registered ([`GroupSync::wait_for_waiters`]), or by any caller's. A
//! sync of that thread that fails fails the waiters it was to cover ([`GroupSync::fail_upto`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

#[derive(Default)]
struct State {
    /// The last ticket issued.
    issued: u64,
    /// Every ticket up to this one is covered by a finished sync.
    covered: u64,
    /// A sync is running.
    running: bool,
    /// Futures waiting for their ticket to be covered, by ticket.
    waiters: HashMap<u64, Waker>,
    /// Tickets of waiting futures whose sync failed, with the error.
    failed: HashMap<u64, String>,
    /// Nobody runs syncs for futures any more (the engine shut down): why.
    shut: Option<String>,
    /// The log-sync thread is asked to stop.
    stopping: bool,
}

#[derive(Default)]
pub(crate) struct GroupSync {
    state: Mutex<State>,
    finished: Condvar,
    /// Signalled when a future starts waiting (the log-sync thread waits on it).
    waiting: Condvar,
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
            let mut woken = Vec::new();
            if r.is_ok() {
                s.covered = s.covered.max(upto);
                let covered = s.covered;
                s.waiters.retain(|t, w| {
                    if *t <= covered {
                        woken.push(w.clone());
                    }
                    *t > covered
                });
            }
            self.finished.notify_all();
            if !woken.is_empty() {
                drop(s);
                woken.into_iter().for_each(Waker::wake);
                s = self.state.lock();
            }
            r?;
        }
    }

    /// A future that is ready once everything written before this call is durable: once a
    /// sync that started after this call has succeeded (or with the error of the sync that
    /// was to cover it).
    pub(crate) fn durable(&self) -> Durable<'_> {
        let mut s = self.state.lock();
        s.issued += 1;
        Durable { sync: self, ticket: s.issued }
    }

    /// Waits until a future waits for a sync, at most `timeout`; returns the last ticket
    /// issued, which the caller's next sync will cover (or fail). None once the thread is
    /// asked to stop ([`stop`](Self::stop)).
    pub(crate) fn wait_for_waiters(&self, timeout: Duration) -> Option<u64> {
        let mut s = self.state.lock();
        if !s.stopping && !s.waiters.keys().any(|t| *t > s.covered) {
            self.waiting.wait_for(&mut s, timeout);
        }
        (!s.stopping).then_some(s.issued)
    }

    /// Asks the log-sync thread to stop: `wait_for_waiters` returns None now.
    pub(crate) fn stop(&self) {
        self.state.lock().stopping = true;
        self.waiting.notify_all();
    }

    /// Fails the waiting futures with tickets up to `upto` that no sync covered: their sync
    /// failed with `error`.
    pub(crate) fn fail_upto(&self, upto: u64, error: &str) {
        let mut woken = Vec::new();
        {
            let mut s = self.state.lock();
            let covered = s.covered;
            let failing: Vec<u64> = s.waiters.keys().copied().filter(|t| *t <= upto && *t > covered).collect();
            for t in failing {
                woken.extend(s.waiters.remove(&t));
                s.failed.insert(t, error.to_string());
            }
        }
        woken.into_iter().for_each(Waker::wake);
    }

    /// The log-sync thread stops: fails the futures waiting now and every one made later.
    pub(crate) fn shut_down(&self, error: &str) {
        self.state.lock().shut = Some(error.to_string());
        self.fail_upto(u64::MAX, error);
    }
}

/// See [`GroupSync::durable`].
pub struct Durable<'a> {
    sync: &'a GroupSync,
    ticket: u64,
}

impl Future for Durable<'_> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut s = self.sync.state.lock();
        if s.covered >= self.ticket {
            s.waiters.remove(&self.ticket);
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = s.failed.remove(&self.ticket).or_else(|| s.shut.clone()) {
            return Poll::Ready(Err(Error::Io(format!("metadata log sync: {e}"))));
        }
        let first = s.waiters.insert(self.ticket, cx.waker().clone()).is_none();
        drop(s);
        if first {
            self.sync.waiting.notify_all();
        }
        Poll::Pending
    }
}

impl Drop for Durable<'_> {
    fn drop(&mut self) {
        let mut s = self.sync.state.lock();
        s.waiters.remove(&self.ticket);
        s.failed.remove(&self.ticket);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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

    /// Polls `f` on this thread until it is ready, parking in between.
    fn block_on<F: Future>(f: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A future is ready once a sync that started after it was made has succeeded; the
    /// log-sync thread, which otherwise syncs only every 30 s here, runs that sync as soon as
    /// the future waits. When the thread stops, it fails whoever still waits.
    #[test]
    fn futures_are_ready_after_a_sync_the_thread_runs_as_they_wait() {
        let g = Arc::new(GroupSync::default());
        let written = Arc::new(AtomicU64::new(0));
        let durable = Arc::new(AtomicU64::new(0));
        let thread = {
            let (g, written, durable) = (g.clone(), written.clone(), durable.clone());
            std::thread::spawn(move || {
                loop {
                    if g.wait_for_waiters(Duration::from_secs(30)).is_none() {
                        g.shut_down("stopped");
                        return;
                    }
                    g.sync(|| {
                        durable.fetch_max(written.load(Ordering::SeqCst), Ordering::SeqCst);
                        Ok(())
                    })
                    .unwrap();
                }
            })
        };
        let start = std::time::Instant::now();
        for _ in 0..20 {
            let mine = written.fetch_add(1, Ordering::SeqCst) + 1;
            block_on(g.durable()).unwrap();
            assert!(durable.load(Ordering::SeqCst) >= mine, "ready before its write was synced");
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the thread waited for its interval");
        g.stop();
        let e = block_on(g.durable()).unwrap_err();
        assert!(e.to_string().contains("stopped"), "{e}");
        thread.join().unwrap();
        // With the thread gone, a future made later fails at once instead of waiting forever.
        let e = block_on(g.durable()).unwrap_err();
        assert!(e.to_string().contains("stopped"), "{e}");
    }

    /// A failed sync fails the futures waiting when it started, not later ones; a blocking
    /// caller's sync makes waiting futures ready and wakes them.
    #[test]
    fn a_failed_sync_fails_the_futures_it_was_to_cover() {
        let g = GroupSync::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut first = std::pin::pin!(g.durable());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        let upto = g.wait_for_waiters(Duration::ZERO).expect("not stopped");
        let mut later = std::pin::pin!(g.durable());
        assert!(later.as_mut().poll(&mut cx).is_pending());
        g.fail_upto(upto, "disk gone");
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        match first.as_mut().poll(&mut cx) {
            Poll::Ready(Err(e)) => assert!(e.to_string().contains("disk gone"), "{e}"),
            other => panic!("expected the sync's error, got {:?}", other.map(|r| r.is_ok())),
        }
        assert!(later.as_mut().poll(&mut cx).is_pending());
        g.sync(|| Ok(())).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(matches!(later.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
        // A future made after the last sync waits for the next one.
        let mut next = std::pin::pin!(g.durable());
        assert!(next.as_mut().poll(&mut cx).is_pending());
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
