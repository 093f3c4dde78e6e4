//! The identity of the session whose request is being served, for backends that enforce
//! permissions per user (Aquifer patch; not in smb-server 0.8.0 upstream).

use crate::proto::auth::ntlm::Identity;

tokio::task_local! {
    static REQUEST_IDENTITY: Identity;
}

/// The identity of the session whose request the current task is serving: `Some(user)` or
/// `Some(Identity::Anonymous)` inside a request, `None` outside one (a close at connection
/// teardown or when a durable handle expires).
pub fn request_identity() -> Option<Identity> {
    REQUEST_IDENTITY.try_with(Clone::clone).ok()
}

/// Runs `fut` as a request of `identity`.
pub(crate) fn scope<F: std::future::Future>(
    identity: Identity,
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<Identity, F> {
    REQUEST_IDENTITY.scope(identity, fut)
}
