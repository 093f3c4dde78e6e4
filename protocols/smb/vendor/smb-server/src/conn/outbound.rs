//! A connection's way out for messages other connections raise, such as
//! lease breaks: queued without waiting, never holding the writer open.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use tokio::sync::Notify;
use uuid::Uuid;

use crate::conn::writer::{Body, NoticeError, ResponseQueue};

/// Unsolicited-message handle of one connection. File state refers to it
/// only weakly, and [`Outbound::close`] drops its queue, so neither keeps
/// the writer running after the reader is done.
#[derive(Default)]
pub(crate) struct Outbound {
    /// Never held across an await.
    queue: Mutex<Option<ResponseQueue>>,
    killed: Notify,
    is_killed: AtomicBool,
    /// The connections of the client this connection belongs to, set when
    /// its NEGOTIATE names a ClientGuid (Aquifer patch).
    client: OnceLock<Arc<ClientConnections>>,
}

impl Outbound {
    /// Starts sending through `queue`.
    pub(crate) fn attach(&self, queue: ResponseQueue) {
        *self.queue.lock().unwrap_or_else(PoisonError::into_inner) = Some(queue);
    }

    /// Stops sending, so the writer can finish once the reader has.
    pub(crate) fn close(&self) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// Queues an unsolicited message without waiting.
    pub(crate) fn try_send_notice(&self, bytes: Vec<u8>) -> Result<(), NoticeError> {
        match &*self.queue.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(queue) => queue.try_send_notice(bytes),
            None => Err(NoticeError::Closed),
        }
    }

    /// Queues a response to a request completed after its interim
    /// response, waiting while the queue is full.
    pub(crate) async fn send(&self, bytes: impl Into<Body>) -> Result<(), ()> {
        let queue = self
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match queue {
            Some(queue) => queue.send(bytes).await,
            None => Err(()),
        }
    }

    /// Ends the connection: its reader stops at the next frame boundary.
    pub(crate) fn kill(&self) {
        self.is_killed.store(true, Ordering::Release);
        self.killed.notify_waiters();
    }

    /// The first connection of this connection's client that is still
    /// open, in the order their NEGOTIATEs arrived; `None` for a connection
    /// whose client named no ClientGuid.
    pub(crate) fn client_first(&self) -> Option<Arc<Outbound>> {
        self.client.get()?.first()
    }

    /// Resolves once [`Outbound::kill`] has been called.
    pub(crate) async fn killed(&self) {
        loop {
            let notified = self.killed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_killed.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// The connections of one client (one ClientGuid), in the order their
/// NEGOTIATEs arrived (Aquifer patch). A lease belongs to a client, not to a
/// connection (MS-SMB2 3.3.1.11), and Windows and Samba send its breaks on
/// the client's first connection that is still open, whichever connection
/// the opens holding the lease came through; smbtorture's
/// `smb2.lease.v2_complex1` expects exactly that. Each connection holds its
/// client's list, so the list lives while any of them does.
#[derive(Default)]
pub(crate) struct ClientConnections {
    /// A leaf lock: nothing else is taken while it is held.
    conns: Mutex<Vec<Weak<Outbound>>>,
}

impl ClientConnections {
    fn first(&self) -> Option<Arc<Outbound>> {
        self.conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find_map(Weak::upgrade)
    }

    fn push(&self, outbound: &Arc<Outbound>) {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(outbound));
    }
}

/// Every client with a connection open, by ClientGuid (Aquifer patch).
#[derive(Default)]
pub(crate) struct ClientTable {
    clients: Mutex<HashMap<Uuid, Weak<ClientConnections>>>,
}

impl ClientTable {
    /// Adds the connection of `outbound`, whose NEGOTIATE named `client`, to
    /// that client's connections. A nil ClientGuid names no client: such
    /// connections stay on their own. A connection joins one client, once.
    pub(crate) fn join(&self, client: Uuid, outbound: &Arc<Outbound>) {
        if client.is_nil() || outbound.client.get().is_some() {
            return;
        }
        let connections = {
            let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
            // Clients whose connections are all gone leave the table here,
            // so it holds no more entries than clients with connections,
            // plus the one joining.
            clients.retain(|_, c| c.strong_count() > 0);
            match clients.get(&client).and_then(Weak::upgrade) {
                Some(connections) => connections,
                None => {
                    let connections = Arc::new(ClientConnections::default());
                    clients.insert(client, Arc::downgrade(&connections));
                    connections
                }
            }
        };
        connections.push(outbound);
        // Set once: the check above ran on this connection's only NEGOTIATE.
        let _ = outbound.client.set(connections);
    }

    /// How many clients have a connection open.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients.values().filter(|c| c.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::writer::response_queue;

    #[tokio::test]
    async fn notices_need_an_attached_queue() {
        let outbound = Outbound::default();
        assert_eq!(outbound.try_send_notice(vec![1]), Err(NoticeError::Closed));
        let (tx, rx) = response_queue();
        outbound.attach(tx.clone());
        outbound.try_send_notice(vec![1]).unwrap();
        drop(tx);
        outbound.close();
        assert_eq!(outbound.try_send_notice(vec![1]), Err(NoticeError::Closed));
        drop(rx);
    }

    #[test]
    fn a_client_s_first_open_connection_comes_first() {
        let table = ClientTable::default();
        let client = Uuid::from_u128(1);
        let first = Arc::new(Outbound::default());
        let second = Arc::new(Outbound::default());
        let other = Arc::new(Outbound::default());
        let anonymous = Arc::new(Outbound::default());
        table.join(client, &first);
        table.join(client, &second);
        table.join(Uuid::from_u128(2), &other);
        table.join(Uuid::nil(), &anonymous);
        assert!(Arc::ptr_eq(&second.client_first().unwrap(), &first));
        assert!(Arc::ptr_eq(&other.client_first().unwrap(), &other));
        assert!(anonymous.client_first().is_none());
        assert_eq!(table.len(), 2);

        // A second join of a connection changes nothing.
        table.join(Uuid::from_u128(2), &second);
        assert!(Arc::ptr_eq(&second.client_first().unwrap(), &first));

        drop(first);
        assert!(Arc::ptr_eq(&second.client_first().unwrap(), &second));
        // A later connection of the client comes after those still open.
        let third = Arc::new(Outbound::default());
        table.join(client, &third);
        assert!(Arc::ptr_eq(&third.client_first().unwrap(), &second));
        drop((second, third, other));
        assert_eq!(table.len(), 0);
        let again = Arc::new(Outbound::default());
        table.join(client, &again);
        assert!(Arc::ptr_eq(&again.client_first().unwrap(), &again));
        assert_eq!(table.clients.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn kill_wakes_a_waiter_and_later_ones() {
        let outbound = std::sync::Arc::new(Outbound::default());
        let waiter = tokio::spawn({
            let outbound = std::sync::Arc::clone(&outbound);
            async move { outbound.killed().await }
        });
        tokio::task::yield_now().await;
        outbound.kill();
        waiter.await.unwrap();
        outbound.killed().await;
    }
}
