//! READ handler.

use std::sync::Arc;

use crate::proto::header::{SMB2_HEADER_LEN, Smb2Header};
use crate::proto::messages::{ReadRequest, ReadResponse};

use crate::access_mask::{FILE_EXECUTE, FILE_READ_DATA};
use crate::conn::state::Connection;
use crate::dispatch::HandlerResponse;
use crate::handlers::shared::{channel_is_valid, lookup_open, lookup_session_tree};
use crate::ntstatus;
use crate::server::ServerState;

/// READ data above this size is sent from where it lies instead of copied
/// into the response (Aquifer patch).
const TAIL_BYTES_MIN: usize = 64 * 1024;

pub async fn handle(
    _server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    hdr: &Smb2Header,
    body: &[u8],
) -> HandlerResponse {
    let req = match ReadRequest::parse(body) {
        Ok(r) => r,
        Err(_) => return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER),
    };
    let max_read = *conn.max_read_size.read().await;
    if req.length > max_read {
        return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
    }
    let tree_arc = match lookup_session_tree(conn, hdr).await {
        Ok(t) => t,
        Err(s) => return HandlerResponse::err(s),
    };
    let open_arc = match lookup_open(&tree_arc, req.file_id).await {
        Some(o) => o,
        None => return HandlerResponse::err(ntstatus::STATUS_FILE_CLOSED),
    };
    let result = {
        let open = open_arc.read().await;
        // Aquifer patch: MS-SMB2 3.3.5.12 wants GrantedAccess to allow for
        // reading data; as on Windows and Samba, FILE_EXECUTE does (a program
        // is read to run it). An open is no longer granted FILE_READ_DATA it
        // did not ask for, so both rights are checked here.
        if open.granted_access & (FILE_READ_DATA | FILE_EXECUTE) == 0 {
            return HandlerResponse::err(ntstatus::STATUS_ACCESS_DENIED);
        }
        if !channel_is_valid(*conn.dialect.read().await, req.channel) {
            return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
        }
        if req.length > 0
            && let Some(file) = open.file.as_ref()
            && let Err(status) = file.check_io(req.offset, req.length.into(), false)
        {
            return HandlerResponse::err(status);
        }
        let result = match open.handle.as_ref() {
            Some(h) => h.read(req.offset, req.length).await,
            None => return HandlerResponse::err(ntstatus::STATUS_FILE_CLOSED),
        };
        // Aquifer patch: the open's CurrentByteOffset follows its reads, as
        // Samba keeps it (FilePositionInformation reports it).
        if let (Ok(bytes), Some(file)) = (&result, open.file.as_ref())
            && bytes.len() >= req.minimum_count as usize
            && !(bytes.is_empty() && req.length > 0)
        {
            file.set_position(req.offset.saturating_add(bytes.len() as u64));
        }
        result
    };
    let bytes = match result {
        Ok(b) => b,
        // Aquifer patch: READ on a directory is STATUS_INVALID_DEVICE_REQUEST,
        // as Windows and Samba answer (MS-SMB2 3.3.5.12).
        Err(crate::SmbError::IsDirectory) => {
            return HandlerResponse::err(ntstatus::STATUS_INVALID_DEVICE_REQUEST);
        }
        Err(e) => return HandlerResponse::err(e.to_nt_status()),
    };
    // MS-SMB2 3.3.5.12: fewer bytes than MinimumCount is end of file.
    if (bytes.is_empty() && req.length > 0) || bytes.len() < req.minimum_count as usize {
        return HandlerResponse::err(ntstatus::STATUS_END_OF_FILE);
    }
    // Aquifer patch: the body behind room for the header; a large READ's
    // data follows it from where it lies (the read-ahead's drive buffer),
    // a small one is copied into it.
    if bytes.len() > TAIL_BYTES_MIN {
        let head = ReadResponse::encode_head_after(SMB2_HEADER_LEN, bytes.len(), 0);
        return HandlerResponse::ok_after_header_with_tail(head, bytes);
    }
    let buf = ReadResponse::encode_data_after(SMB2_HEADER_LEN, &bytes);
    HandlerResponse::ok_after_header(buf)
}
