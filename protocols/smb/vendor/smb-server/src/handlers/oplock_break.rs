//! OPLOCK_BREAK handler (MS-SMB2 3.3.5.22): oplock and lease break
//! acknowledgments.

use std::sync::Arc;

use crate::proto::header::Smb2Header;
use crate::proto::messages::oplock_break::OplockBreakAck;
use crate::proto::messages::{Dialect, LeaseBreakAck, LeaseBreakResponse};

use crate::conn::state::Connection;
use crate::dispatch::HandlerResponse;
use crate::files::{LeaseId, OPLOCK_BREAK_SIZE, oplock_body};
use crate::handlers::shared::{lookup_open, lookup_session_tree};
use crate::ntstatus;
use crate::server::ServerState;

/// StructureSize of an oplock break acknowledgment.
const OPLOCK_ACK_SIZE: u16 = OPLOCK_BREAK_SIZE;
/// StructureSize of a lease break acknowledgment.
const LEASE_ACK_SIZE: u16 = 36;

pub async fn handle(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    hdr: &Smb2Header,
    body: &[u8],
) -> HandlerResponse {
    let tree = match lookup_session_tree(conn, hdr).await {
        Ok(t) => t,
        Err(status) => return HandlerResponse::err(status),
    };
    let structure_size = body.get(..2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let dialect = *conn.dialect.read().await;
    match structure_size {
        // MS-SMB2 3.3.5.22.2.
        Some(LEASE_ACK_SIZE) if dialect != Some(Dialect::Smb202) => {
            let Ok(ack) = LeaseBreakAck::parse(body) else {
                return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
            };
            let id = LeaseId {
                client: *conn.client_guid.read().await,
                key: ack.lease_key,
            };
            match server.leases.acknowledge(id, ack.lease_state) {
                Ok((state, breaks)) => {
                    let mut buf = Vec::new();
                    LeaseBreakResponse {
                        structure_size: LEASE_ACK_SIZE,
                        reserved: 0,
                        flags: 0,
                        lease_key: ack.lease_key,
                        lease_state: state.bits(),
                        lease_duration: 0,
                    }
                    .write_to(&mut buf)
                    .expect("encoding into a Vec cannot fail");
                    // A further break follows the response.
                    let mut response = HandlerResponse::ok(buf);
                    response.after_send.push(Box::new(breaks));
                    response
                }
                Err(status) => HandlerResponse::err(status),
            }
        }
        // MS-SMB2 3.3.5.22.1 (Aquifer patch: upstream granted no oplocks
        // and refused every acknowledgment). A 36-byte body on SMB 2.0.2,
        // which has no leases, is read as an oplock acknowledgment.
        Some(OPLOCK_ACK_SIZE | LEASE_ACK_SIZE) => {
            let Ok(ack) = OplockBreakAck::parse(body) else {
                return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
            };
            let Some(open_arc) = lookup_open(&tree, ack.file_id).await else {
                return HandlerResponse::err(ntstatus::STATUS_FILE_CLOSED);
            };
            let open = open_arc.read().await;
            let Some(file) = open.file.as_ref() else {
                // A named pipe or a directory holds no oplock.
                return HandlerResponse::err(ntstatus::STATUS_INVALID_DEVICE_STATE);
            };
            match file.acknowledge_oplock(ack.oplock_level) {
                Ok((level, breaks)) => {
                    drop(open);
                    let mut buf = Vec::new();
                    oplock_body(ack.file_id, level)
                        .write_to(&mut buf)
                        .expect("encoding into a Vec cannot fail");
                    // A further break to NONE follows the response.
                    let mut response = HandlerResponse::ok(buf);
                    response.after_send.push(Box::new(breaks));
                    response
                }
                Err(status) => HandlerResponse::err(status),
            }
        }
        _ => HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER),
    }
}
