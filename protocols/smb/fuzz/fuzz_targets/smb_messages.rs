//! Fuzzes the SMB server's message decoding as a network client meets it (the vendored
//! smb-server's `cfg(fuzzing)` entry points, protocols/smb/vendor/smb-server/src/lib.rs).
//!
//! The first byte picks what the rest is:
//! - 0..=191: a client's byte stream — transport frames as on the wire — dispatched frame by
//!   frame on one connection to a server with a public (guest) share of a temporary
//!   directory: NEGOTIATE, SESSION_SETUP (SPNEGO, NTLM, anonymous logons), TREE_CONNECT and,
//!   once a session exists, every command;
//! - above: one parser alone (frame header, SMB2 header, SPNEGO, NTLM, lease and durable
//!   create contexts, create context chains, DCE/RPC PDUs and associations, security
//!   descriptors, srvsvc stubs).
//!
//!     RUSTC_BOOTSTRAP=1 cargo fuzz run smb_messages seeds -- -max_total_time=240
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use smb_server::{LocalFsBackend, Share, SmbServer, fuzzing};

struct Fixture {
    rt: tokio::runtime::Runtime,
    server: SmbServer,
    _dir: std::path::PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let dir = std::env::temp_dir().join(format!("aquifer-smb-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).expect("share directory");
        std::fs::write(dir.join("file.txt"), b"fuzz me\n").expect("share file");
        let server = rt.block_on(async {
            SmbServer::builder()
                .listen("127.0.0.1:0".parse().unwrap())
                .share(Share::new("public", LocalFsBackend::new(&dir).expect("backend")).public())
                .build()
                .expect("server")
        });
        Fixture { rt, server, _dir: dir }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    match pick {
        0..=191 => {
            let f = fixture();
            f.rt.block_on(fuzzing::dispatch_stream(&f.server, rest));
        }
        192..=195 => fuzzing::frame(rest),
        196..=199 => fuzzing::header(rest),
        200..=205 => fuzzing::spnego(rest),
        206..=211 => fuzzing::ntlm(rest),
        212..=215 => fuzzing::lease_context(rest),
        216..=219 => fuzzing::lease_ack(rest),
        220..=225 => fuzzing::durable_context(rest),
        226..=233 => fuzzing::durable_ask(rest),
        234..=241 => fuzzing::rpc_pdu(rest),
        242..=249 => fuzzing::rpc_association(rest),
        250..=252 => fuzzing::security_descriptor(rest),
        _ => fuzzing::srvsvc_request(rest),
    }
});
