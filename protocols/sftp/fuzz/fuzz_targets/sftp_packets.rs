//! Fuzzes what an SFTP client's bytes pass through before the engine sees them
//! (protocols/sftp/src/wire.rs, compiled here unchanged): the input is the subsystem's byte
//! stream, cut into packets by their length as `serve::run` cuts it (a packet over the limit
//! ends the session), each packet decoded by russh-sftp, an extended request's data read as
//! the SSH strings its extension takes, and every path split into the steps the session walks.
//!
//!     RUSTC_BOOTSTRAP=1 cargo fuzz run sftp_packets -- -max_total_time=240 -malloc_limit_mb=64
//!
//! Besides crashes and allocations over the limit (a packet is at most 256 KiB), it checks:
//! a path's steps have no empty or `.` component and no `/` inside one, and splitting their
//! joined form gives them back; a decoded request encodes and decodes to
//! the same request; a WRITE read in place (`wire::write_request`) has the fields russh-sftp
//! decodes from it; a `copy-data` request's fields make up its data exactly.
#![no_main]

use std::collections::BTreeMap;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use russh_sftp::protocol::Packet;

#[path = "../../src/wire.rs"]
#[allow(dead_code)]
mod wire;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Some(len) = rest.get(..4) {
        let len = u32::from_be_bytes(len.try_into().expect("four bytes"));
        let Some(n) = wire::packet_len(len) else { break };
        let Some(packet) = rest.get(4..4 + n) else { break };
        rest = &rest[4 + n..];
        if let Some((id, handle, offset, data)) = wire::write_request(packet) {
            // A WRITE read in place must be what russh-sftp decodes.
            match wire::decode(packet.to_vec()) {
                Ok(Packet::Write(w)) => assert_eq!((w.id, w.handle.as_str(), w.offset, &w.data[..]), (id, handle, offset, &packet[data])),
                other => panic!("read in place as a WRITE, decoded as {other:?}"),
            }
        }
        if let Ok(request) = wire::decode(packet.to_vec()) {
            paths(&request);
            round_trip(request);
        }
    }
});

fn path(p: &str) {
    let c: Vec<&str> = wire::steps(p).collect();
    for x in &c {
        assert!(!x.is_empty() && *x != "." && !x.contains('/'), "{p:?} gave component {x:?}");
    }
    // The steps written out again are the same steps.
    let joined = c.join("/");
    assert_eq!(wire::steps(&joined).collect::<Vec<_>>(), c, "{p:?} split twice");
}

fn paths(request: &Packet) {
    match request {
        Packet::Open(p) => path(&p.filename),
        Packet::Remove(p) => path(&p.filename),
        Packet::Lstat(p) => path(&p.path),
        Packet::Stat(p) => path(&p.path),
        Packet::SetStat(p) => path(&p.path),
        Packet::OpenDir(p) => path(&p.path),
        Packet::MkDir(p) => path(&p.path),
        Packet::RmDir(p) => path(&p.path),
        Packet::RealPath(p) => path(&p.path),
        Packet::ReadLink(p) => path(&p.path),
        Packet::Rename(p) => {
            path(&p.oldpath);
            path(&p.newpath);
        }
        Packet::Symlink(p) => {
            path(&p.linkpath);
            path(&p.targetpath);
        }
        // The extensions the session serves, and the strings each takes (session.rs).
        Packet::Extended(p) => match p.request.as_str() {
            "fsync@openssh.com" | "fstatvfs@openssh.com" => {
                let _ = wire::ssh_strings::<1>(&p.data);
            }
            "statvfs@openssh.com" => {
                if let Ok([a]) = wire::ssh_strings::<1>(&p.data) {
                    path(&a);
                }
            }
            // Two handles and three numbers, exactly: what is read encodes back to the data.
            "copy-data" => {
                if let Ok((from, read_at, len, to, write_at)) = wire::copy_data_args(&p.data) {
                    let mut again = Vec::new();
                    again.extend_from_slice(&(from.len() as u32).to_be_bytes());
                    again.extend_from_slice(from.as_bytes());
                    again.extend_from_slice(&read_at.to_be_bytes());
                    again.extend_from_slice(&len.to_be_bytes());
                    again.extend_from_slice(&(to.len() as u32).to_be_bytes());
                    again.extend_from_slice(to.as_bytes());
                    again.extend_from_slice(&write_at.to_be_bytes());
                    assert_eq!(again, p.data, "copy-data's fields do not make up its data");
                }
            }
            // Two strings of packed ids, exactly; the reply holds a name for each id asked.
            "users-groups-by-id@openssh.com" => {
                if let Ok((uids, gids)) = wire::ids_args(&p.data) {
                    assert!(uids.len() <= wire::NAME_IDS_MAX && gids.len() <= wire::NAME_IDS_MAX);
                    let mut again = Vec::new();
                    for ids in [&uids, &gids] {
                        again.extend_from_slice(&(4 * ids.len() as u32).to_be_bytes());
                        ids.iter().for_each(|i| again.extend_from_slice(&i.to_be_bytes()));
                    }
                    assert_eq!(again, p.data, "the ids do not make up the data");
                    let users: Vec<String> = uids.iter().map(|u| if u % 2 == 0 { format!("user{u}") } else { String::new() }).collect();
                    let groups: Vec<String> = gids.iter().map(|g| format!("g{g}")).collect();
                    let reply = wire::names_reply(&users, &groups);
                    let take = |d: &mut &[u8]| -> Vec<u8> {
                        let n = u32::from_be_bytes(d[..4].try_into().expect("a length")) as usize;
                        let s = d[4..4 + n].to_vec();
                        *d = &d[4 + n..];
                        s
                    };
                    let mut r = &reply[..];
                    for names in [&users, &groups] {
                        let list = take(&mut r);
                        let mut l = &list[..];
                        for n in names {
                            assert_eq!(take(&mut l), n.as_bytes(), "a name in the reply");
                        }
                        assert!(l.is_empty(), "more names than ids");
                    }
                    assert!(r.is_empty(), "bytes after the names");
                }
            }
            _ => {
                if let Ok([a, b]) = wire::ssh_strings::<2>(&p.data) {
                    path(&a);
                    path(&b);
                }
            }
        },
        _ => {}
    }
}

/// A packet as the session reads it: its fields, with INIT's and VERSION's extensions in
/// order (a `HashMap`'s order differs from one map to the next).
fn fields(p: &Packet) -> String {
    match p {
        Packet::Init(i) => format!("Init {} {:?}", i.version, i.extensions.iter().collect::<BTreeMap<_, _>>()),
        Packet::Version(v) => format!("Version {} {:?}", v.version, v.extensions.iter().collect::<BTreeMap<_, _>>()),
        p => format!("{p:?}"),
    }
}

fn round_trip(request: Packet) {
    let before = fields(&request);
    let mut wire = Bytes::try_from(request).expect("a decoded packet encodes");
    let len = u32::from_be_bytes(wire[..4].try_into().expect("length")) as usize;
    assert_eq!(len, wire.len() - 4, "length field");
    let mut body = wire.split_off(4);
    let again = Packet::try_from(&mut body).expect("an encoded packet decodes");
    assert_eq!(fields(&again), before, "decoded, encoded and decoded again");
}
