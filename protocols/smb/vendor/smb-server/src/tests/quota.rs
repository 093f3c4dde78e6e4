//! The NT quota fake file through the dispatcher (Aquifer patch): what a
//! CREATE of `$Extend\$Quota:$Q:$INDEX_ALLOCATION` opens, the quota queries
//! and sets on it, and the requests it refuses.

use std::sync::Arc;

use crate::ntstatus;
use crate::proto::header::Command;
use crate::proto::messages::{
    CloseRequest, CreateRequest, CreateResponse, FileId, QueryInfoRequest,
};
use crate::server::ServerState;
use crate::tests::memfs::MemFsBackend;
use crate::tests::peer::{Peer, status};
use crate::{Share, SmbServer};

const QUOTA: &str = "$Extend\\$Quota:$Q:$INDEX_ALLOCATION";
/// FILE_READ_DATA, FILE_READ_EA, FILE_READ_ATTRIBUTES, READ_CONTROL,
/// SYNCHRONIZE: SEC_RIGHTS_FILE_READ, as smbtorture asks.
const READ: u32 = 0x0012_0089;
const FILE_OPEN: u32 = 1;
const INFO_FILE: u8 = 1;
const INFO_SECURITY: u8 = 3;
const INFO_QUOTA: u8 = 4;

async fn server() -> Arc<ServerState> {
    let backend = MemFsBackend::new().with_file("f.txt", b"data");
    SmbServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .share(Share::new("home", backend).public())
        .build()
        .expect("build")
        .state()
}

fn create_body(name: &str, disposition: u32, options: u32) -> Vec<u8> {
    let name = crate::utils::utf16le(name);
    let mut padded = name.clone();
    padded.resize(padded.len().next_multiple_of(8).max(8), 0);
    let mut body = Vec::new();
    CreateRequest {
        structure_size: 57,
        security_flags: 0,
        requested_oplock_level: 0x09, // BATCH, which the fake file never gets.
        impersonation_level: 0,
        smb_create_flags: 0,
        reserved: 0,
        desired_access: READ,
        file_attributes: 0x80,
        share_access: 7,
        create_disposition: disposition,
        create_options: options,
        name_offset: 0x78,
        name_length: name.len() as u16,
        create_contexts_offset: 0,
        create_contexts_length: 0,
        name: padded,
        create_contexts: Vec::new(),
    }
    .write_to(&mut body)
    .expect("create");
    body
}

fn query_body(file_id: FileId, info_type: u8, class: u8, input: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    QueryInfoRequest {
        structure_size: 41,
        info_type,
        file_information_class: class,
        output_buffer_length: 4096,
        input_buffer_offset: if input.is_empty() { 0 } else { 0x68 },
        reserved: 0,
        input_buffer_length: input.len() as u32,
        additional_information: 0,
        flags: 0,
        file_id,
        input_buffer: input.to_vec(),
    }
    .write_to(&mut body)
    .expect("query");
    body
}

/// SET_INFO of `buffer` with the buffer right after the fixed fields.
fn set_body(file_id: FileId, info_type: u8, class: u8, buffer: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&33u16.to_le_bytes());
    body.push(info_type);
    body.push(class);
    body.extend_from_slice(&(buffer.len() as u32).to_le_bytes());
    body.extend_from_slice(&0x60u16.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&file_id.persistent.to_le_bytes());
    body.extend_from_slice(&file_id.volatile.to_le_bytes());
    body.extend_from_slice(buffer);
    body
}

fn close_body(file_id: FileId) -> Vec<u8> {
    let mut body = Vec::new();
    CloseRequest {
        structure_size: 24,
        flags: 0,
        reserved: 0,
        file_id,
    }
    .write_to(&mut body)
    .expect("close");
    body
}

/// SMB2_QUERY_QUOTA_INFO: a restarted scan of every entry.
fn scan() -> Vec<u8> {
    let mut out = vec![0, 1, 0, 0];
    out.extend_from_slice(&[0; 12]);
    out
}

async fn open_quota(peer: &mut Peer, state: &Arc<ServerState>) -> CreateResponse {
    let (_, reply) = peer
        .request(state, Command::Create, &create_body(QUOTA, FILE_OPEN, 0))
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_SUCCESS);
    CreateResponse::parse(&reply[64..]).expect("create response")
}

#[tokio::test]
async fn the_quota_fake_file_opens_as_samba_opens_it() {
    let state = server().await;
    let mut peer = Peer::new(&state, false).await;
    let created = open_quota(&mut peer, &state).await;
    // HIDDEN, SYSTEM, DIRECTORY, ARCHIVE; no times, no size, no oplock.
    assert_eq!(created.file_attributes, 0x36);
    assert_eq!(
        [
            created.creation_time,
            created.last_access_time,
            created.last_write_time,
            created.change_time,
            created.end_of_file,
        ],
        [0; 5]
    );
    assert_eq!(created.oplock_level, 0);
    assert_eq!(created.create_action, 1);
    let id = created.file_id;

    // A scan of the quota entries finds none; so does a query for a SID.
    let (_, reply) = peer
        .request(
            &state,
            Command::QueryInfo,
            &query_body(id, INFO_QUOTA, 0, &scan()),
        )
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_NO_MORE_ENTRIES);
    let sid = [1, 2, 0, 0, 0, 0, 0, 22, 1, 0, 0, 0, 0, 0, 0, 0];
    let mut by_sid = vec![0, 1, 0, 0];
    by_sid.extend_from_slice(&24u32.to_le_bytes());
    by_sid.extend_from_slice(&[0; 8]);
    by_sid.extend_from_slice(&0u32.to_le_bytes());
    by_sid.extend_from_slice(&16u32.to_le_bytes());
    by_sid.extend_from_slice(&sid);
    let (_, reply) = peer
        .request(
            &state,
            Command::QueryInfo,
            &query_body(id, INFO_QUOTA, 0, &by_sid),
        )
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_NO_MORE_ENTRIES);

    // Malformed buffers: none, too short, a SidList past the buffer, a SID
    // whose length is wrong.
    let mut past = by_sid.clone();
    past[4..8].copy_from_slice(&25u32.to_le_bytes());
    let mut wrong_length = by_sid.clone();
    wrong_length[20..24].copy_from_slice(&12u32.to_le_bytes());
    for bad in [Vec::new(), scan()[..15].to_vec(), past, wrong_length] {
        let (_, reply) = peer
            .request(
                &state,
                Command::QueryInfo,
                &query_body(id, INFO_QUOTA, 0, &bad),
            )
            .await;
        assert_eq!(
            status(&reply),
            ntstatus::STATUS_INVALID_PARAMETER,
            "{bad:?}"
        );
    }

    // File queries answer the same attributes.
    let (_, reply) = peer
        .request(
            &state,
            Command::QueryInfo,
            &query_body(id, INFO_FILE, 4, &[]),
        )
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_SUCCESS);
    let basic = &reply[64 + 8..];
    assert_eq!(&basic[..32], &[0; 32]);
    assert_eq!(u32::from_le_bytes(basic[32..36].try_into().unwrap()), 0x36);

    // Quotas cannot be set, nor anything else about the file.
    let entry = [0u8; 40 + 16];
    let (_, reply) = peer
        .request(
            &state,
            Command::SetInfo,
            &set_body(id, INFO_QUOTA, 0, &entry),
        )
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_NOT_SUPPORTED);
    let (_, reply) = peer
        .request(
            &state,
            Command::SetInfo,
            &set_body(id, INFO_FILE, 4, &[0; 40]),
        )
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_ACCESS_DENIED);
    let (_, reply) = peer
        .request(&state, Command::SetInfo, &set_body(id, INFO_FILE, 13, &[1]))
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_ACCESS_DENIED);
    let (_, reply) = peer
        .request(
            &state,
            Command::SetInfo,
            &set_body(id, INFO_SECURITY, 0, &[0; 20]),
        )
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_ACCESS_DENIED);

    let (_, reply) = peer.request(&state, Command::Close, &close_body(id)).await;
    assert_eq!(status(&reply), ntstatus::STATUS_SUCCESS);
    assert_eq!(
        peer.conn
            .open_count
            .load(std::sync::atomic::Ordering::Acquire),
        0
    );
}

#[tokio::test]
async fn quota_queries_on_other_opens_are_not_supported() {
    let state = server().await;
    let mut peer = Peer::new(&state, false).await;
    let (_, reply) = peer
        .request(&state, Command::Create, &create_body("f.txt", FILE_OPEN, 0))
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_SUCCESS);
    let id = CreateResponse::parse(&reply[64..]).unwrap().file_id;
    let (_, reply) = peer
        .request(
            &state,
            Command::QueryInfo,
            &query_body(id, INFO_QUOTA, 0, &scan()),
        )
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_NOT_SUPPORTED);
}

#[tokio::test]
async fn the_quota_fake_file_is_only_opened_where_it_is() {
    let state = server().await;
    let mut peer = Peer::new(&state, false).await;
    let cases = [
        // It exists: CREATE collides; it cannot be overwritten or superseded.
        (QUOTA, 2, 0, ntstatus::STATUS_OBJECT_NAME_COLLISION),
        (QUOTA, 0, 0, ntstatus::STATUS_ACCESS_DENIED),
        (QUOTA, 4, 0, ntstatus::STATUS_ACCESS_DENIED),
        (QUOTA, 5, 0, ntstatus::STATUS_ACCESS_DENIED),
        // An index, not a non-directory file.
        (QUOTA, FILE_OPEN, 0x40, ntstatus::STATUS_FILE_IS_A_DIRECTORY),
        // Other names with a stream are refused as before.
        (
            "dir\\$Extend\\$Quota:$Q:$INDEX_ALLOCATION",
            FILE_OPEN,
            0,
            ntstatus::STATUS_OBJECT_NAME_INVALID,
        ),
        (
            "$extend\\$quota:$q:$index_allocation",
            FILE_OPEN,
            0,
            ntstatus::STATUS_OBJECT_NAME_INVALID,
        ),
    ];
    for (name, disposition, options, expected) in cases {
        let (_, reply) = peer
            .request(
                &state,
                Command::Create,
                &create_body(name, disposition, options),
            )
            .await;
        assert_eq!(status(&reply), expected, "{name} disposition {disposition}");
    }
    // OPEN_IF opens it.
    let (_, reply) = peer
        .request(&state, Command::Create, &create_body(QUOTA, 3, 0))
        .await;
    assert_eq!(status(&reply), ntstatus::STATUS_SUCCESS);
    // Nothing was made in the share.
    let share = state.find_share("home").await.unwrap();
    let opts = crate::backend::OpenOptions {
        directory: true,
        ..Default::default()
    };
    let (root, _) = share
        .backend
        .open(&crate::path::SmbPath::root(), opts)
        .await
        .unwrap();
    let names: Vec<String> = root
        .list_dir(None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.info.name)
        .collect();
    assert_eq!(names, ["f.txt"]);
}
