//! Completion handles for submitted drive I/O.

use std::io;
use std::sync::mpsc;

/// Completion handle of one submitted I/O. [`wait`](Self::wait) blocks the calling thread until
/// the drive has finished the request.
///
/// Dropping the handle does not cancel the request: the drive finishes it and discards the
/// result.
#[must_use = "an I/O's result is only known by waiting for it"]
pub struct IoCompletion<T> {
    state: State<T>,
}

enum State<T> {
    Ready(io::Result<T>),
    /// Completed by the drive's I/O thread through the paired [`Completer`].
    Pending(mpsc::Receiver<io::Result<T>>),
    /// Completed by running a function on the waiting thread, which typically waits for
    /// another completion first (the fault-injecting drive post-processes reads this way).
    Deferred(Box<dyn FnOnce() -> io::Result<T> + Send>),
}

impl<T> IoCompletion<T> {
    /// Blocks until the I/O has finished and returns its result.
    pub fn wait(self) -> io::Result<T> {
        match self.state {
            State::Ready(result) => result,
            State::Pending(rx) => rx.recv().unwrap_or_else(|_| {
                // The I/O thread dropped the request without answering: it stopped after an
                // unrecoverable ring error (already logged there).
                Err(io::Error::other("drive I/O thread stopped before completing the request"))
            }),
            State::Deferred(f) => f(),
        }
    }

    /// A handle that is already complete.
    pub fn ready(v: io::Result<T>) -> Self {
        Self { state: State::Ready(v) }
    }

    /// A handle and the completer that the I/O thread uses to finish it.
    pub(crate) fn pending() -> (Self, Completer<T>) {
        // Capacity 1: the single send never blocks the I/O thread.
        let (tx, rx) = mpsc::sync_channel(1);
        (Self { state: State::Pending(rx) }, Completer { tx })
    }

    pub(crate) fn deferred(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> Self {
        Self { state: State::Deferred(Box::new(f)) }
    }
}

/// The I/O-thread side of an [`IoCompletion`].
pub(crate) struct Completer<T> {
    tx: mpsc::SyncSender<io::Result<T>>,
}

impl<T> Completer<T> {
    pub(crate) fn complete(self, result: io::Result<T>) {
        // The waiter may have dropped its handle; then nobody wants the result.
        let _ = self.tx.try_send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_pending_deferred_and_abandoned() {
        assert_eq!(IoCompletion::ready(Ok(3)).wait().unwrap(), 3);

        let (c, done) = IoCompletion::<u32>::pending();
        let t = std::thread::spawn(move || done.complete(Ok(5)));
        assert_eq!(c.wait().unwrap(), 5);
        t.join().unwrap();

        let (c, done) = IoCompletion::<u32>::pending();
        drop(done);
        let err = c.wait().unwrap_err();
        assert!(err.to_string().contains("I/O thread stopped"), "{err}");

        let (inner, done) = IoCompletion::<u32>::pending();
        let outer = IoCompletion::deferred(move || inner.wait().map(|v| v * 2));
        done.complete(Ok(21));
        assert_eq!(outer.wait().unwrap(), 42);
    }
}
