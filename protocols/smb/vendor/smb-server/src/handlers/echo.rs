//! ECHO handler (MS-SMB2 3.3.5.17).

use std::sync::Arc;

use crate::proto::header::{SMB2_FLAGS_SIGNED, Smb2Header};
use crate::proto::messages::EchoResponse;

use crate::conn::state::Connection;
use crate::dispatch::HandlerResponse;
use crate::handlers::shared::lookup_session;
use crate::server::ServerState;

pub async fn handle(
    _server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    hdr: &Smb2Header,
    _body: &[u8],
) -> HandlerResponse {
    // Aquifer patch: ECHO is answered on a connection without a session too
    // (upstream closed it), as Windows and Samba answer a keepalive after the
    // last LOGOFF. A connection that never logs on is still closed by the
    // handshake timeout, which ECHO does not extend.
    if (hdr.flags & SMB2_FLAGS_SIGNED != 0 || hdr.session_id != 0)
        && let Err(status) = lookup_session(conn, hdr.session_id).await
    {
        return HandlerResponse::err(status);
    }
    let mut buf = Vec::new();
    EchoResponse::default().write_to(&mut buf).expect("encode");
    HandlerResponse::ok(buf)
}
