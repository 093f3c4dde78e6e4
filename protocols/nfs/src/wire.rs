//! The untrusted edge of the NFS service: ONC RPC record marking (RFC 5531 §11), the call
//! header, and XDR argument decoding. Pure functions of bytes (plus an async reader), with
//! no dependency on the rest of the crate, so that the fuzz target (protocols/nfs/fuzz)
//! compiles exactly this file.

use std::io::Cursor;

use nfs3_types::rpc::{auth_flavor, msg_body, rpc_msg};
use nfs3_types::xdr_codec::Unpack;
use tokio::io::AsyncReadExt;

/// Largest record accepted: a 1 MiB WRITE plus headers.
pub const RECORD_BYTES_MAX: usize = (1 << 20) + 64 * 1024;

/// Reads one record: fragments until the last one, at most `RECORD_BYTES_MAX` in all.
/// `Ok(None)` at a clean end of stream between records.
pub async fn read_record(rd: &mut (impl AsyncReadExt + Unpin)) -> anyhow::Result<Option<Vec<u8>>> {
    let mut record = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        match rd.read_exact(&mut mark).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && record.is_empty() => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let mark = u32::from_be_bytes(mark);
        let last = mark & 0x8000_0000 != 0;
        let len = (mark & 0x7fff_ffff) as usize;
        if record.len() + len > RECORD_BYTES_MAX {
            anyhow::bail!("record of more than {RECORD_BYTES_MAX} bytes refused");
        }
        // Read into the spare capacity: a 1 MiB WRITE's record is not zeroed first. The first
        // fragment (most records have one) is reserved exactly; later ones grow the buffer by
        // doubling, so that a record sent as many small fragments is not reallocated for each.
        if record.is_empty() {
            record.reserve_exact(len);
        } else {
            record.reserve(len);
        }
        let mut fragment = (&mut *rd).take(len as u64);
        while fragment.limit() > 0 {
            if fragment.read_buf(&mut record).await? == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
        }
        if last {
            return Ok(Some(record));
        }
    }
}

/// The parts of a call header the dispatcher needs, with the offset of the arguments.
pub struct CallHeader {
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub rpcvers: u32,
    pub cred_flavor: auth_flavor,
    pub cred_body: Vec<u8>,
    pub args_at: usize,
}

/// Decodes a call header. A record that is not an RPC call ends the connection.
pub fn parse_call(record: &[u8]) -> anyhow::Result<Option<(u32, CallHeader)>> {
    let mut cur = Cursor::new(record);
    let (msg, _) = rpc_msg::unpack(&mut cur).map_err(|e| anyhow::anyhow!("undecodable RPC record: {e}"))?;
    let call = match msg.body {
        msg_body::CALL(c) => c,
        // A reply sent to a server means nothing; drop it.
        msg_body::REPLY(_) => return Ok(None),
    };
    Ok(Some((
        msg.xid,
        CallHeader {
            prog: call.prog,
            vers: call.vers,
            proc_: call.proc,
            rpcvers: call.rpcvers,
            cred_flavor: call.cred.flavor,
            cred_body: call.cred.body.0.to_vec(),
            args_at: cur.position() as usize,
        },
    )))
}

/// Decodes the whole of `args` as `T`; trailing bytes are garbage.
pub fn decode<T: Unpack>(args: &[u8]) -> Option<T> {
    let mut cur = Cursor::new(args);
    let (v, _) = T::unpack(&mut cur).ok()?;
    if cur.position() as usize != args.len() {
        return None;
    }
    Some(v)
}

