//! Fuzzes the untrusted edge of the NFS service exactly as a connection meets it: record
//! marks, the RPC call header, the AUTH_SYS credential, and the XDR arguments of every
//! MOUNT and NFSv3 procedure (protocols/nfs/src/wire.rs, compiled here unchanged).
//!
//!     RUSTC_BOOTSTRAP=1 cargo fuzz run rpc_record -- -max_total_time=300
#![no_main]

use libfuzzer_sys::fuzz_target;
use nfs3_types::mount::dirpath;
use nfs3_types::nfs3::*;
use nfs3_types::rpc::auth_unix;

#[path = "../../src/wire.rs"]
#[allow(dead_code)]
mod wire;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().expect("runtime"))
}

fuzz_target!(|data: &[u8]| {
    let mut rd = data;
    // A connection reads records until the stream ends or a record is refused.
    while let Ok(Some(record)) = runtime().block_on(wire::read_record(&mut rd)) {
        assert!(record.len() <= wire::RECORD_BYTES_MAX);
        let Ok(Some((_xid, call))) = wire::parse_call(&record) else { continue };
        assert!(call.args_at <= record.len());
        let _ = wire::decode::<auth_unix>(&call.cred_body);
        let args = &record[call.args_at..];
        let _ = wire::decode::<dirpath>(args);
        let _ = wire::decode::<GETATTR3args>(args);
        let _ = wire::decode::<SETATTR3args>(args);
        let _ = wire::decode::<LOOKUP3args>(args);
        let _ = wire::decode::<ACCESS3args>(args);
        let _ = wire::decode::<READLINK3args>(args);
        let _ = wire::decode::<READ3args>(args);
        let _ = wire::decode::<WRITE3args>(args);
        let _ = wire::decode::<CREATE3args>(args);
        let _ = wire::decode::<MKDIR3args>(args);
        let _ = wire::decode::<SYMLINK3args>(args);
        let _ = wire::decode::<MKNOD3args>(args);
        let _ = wire::decode::<REMOVE3args>(args);
        let _ = wire::decode::<RENAME3args>(args);
        let _ = wire::decode::<LINK3args>(args);
        let _ = wire::decode::<READDIR3args>(args);
        let _ = wire::decode::<READDIRPLUS3args>(args);
        let _ = wire::decode::<FSSTAT3args>(args);
        let _ = wire::decode::<FSINFO3args>(args);
        let _ = wire::decode::<PATHCONF3args>(args);
        let _ = wire::decode::<COMMIT3args>(args);
    }
});
