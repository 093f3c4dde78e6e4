//! A connection's READs and WRITEs run concurrently, driven through the
//! reader and writer over a loopback socket: a backend that lets no READ or
//! WRITE finish until four are in progress answers only if they run at
//! once, and the CLOSE behind them answers after all of them.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::conn::{reader, writer};
use crate::proto::framing::{FRAME_HEADER_LEN, decode_frame_header, encode_frame};
use crate::proto::header::{Command, SMB2_HEADER_LEN};
use crate::proto::messages::{
    CloseRequest, CreateRequest, CreateResponse, FileId, ReadRequest, ReadResponse, WriteRequest,
};
use crate::server::ServerState;
use crate::tests::memfs::MemFsBackend;
use crate::tests::peer::{Peer, header, status};
use crate::{Share, SmbServer};

/// READs or WRITEs the backend lets through together.
const AT_ONCE: usize = 4;
const PIECE: usize = 64 * 1024;

fn create_body() -> Vec<u8> {
    let mut name = crate::utils::utf16le("f.bin");
    let name_length = name.len() as u16;
    name.resize(name.len().next_multiple_of(8), 0);
    let mut body = Vec::new();
    CreateRequest {
        structure_size: 57,
        security_flags: 0,
        requested_oplock_level: 0,
        impersonation_level: 2,
        smb_create_flags: 0,
        reserved: 0,
        desired_access: 0x3, // READ_DATA | WRITE_DATA
        file_attributes: 0,
        share_access: 0x3,
        create_disposition: 1, // FILE_OPEN
        create_options: 0,
        name_offset: 0x78,
        name_length,
        create_contexts_offset: 0,
        create_contexts_length: 0,
        name,
        create_contexts: Vec::new(),
    }
    .write_to(&mut body)
    .expect("create");
    body
}

fn write_body(file_id: FileId, offset: u64, data: Vec<u8>) -> Vec<u8> {
    let mut body = Vec::new();
    WriteRequest {
        structure_size: 49,
        data_offset: WriteRequest::STANDARD_DATA_OFFSET,
        length: data.len() as u32,
        offset,
        file_id,
        channel: 0,
        remaining_bytes: 0,
        write_channel_info_offset: 0,
        write_channel_info_length: 0,
        flags: 0,
        data,
    }
    .write_to(&mut body)
    .expect("write");
    body
}

fn read_body(file_id: FileId, offset: u64) -> Vec<u8> {
    let mut body = Vec::new();
    ReadRequest {
        structure_size: 49,
        padding: ReadResponse::STANDARD_DATA_OFFSET,
        flags: 0,
        length: PIECE as u32,
        offset,
        file_id,
        minimum_count: 0,
        channel: 0,
        remaining_bytes: 0,
        read_channel_info_offset: 0,
        read_channel_info_length: 0,
        buffer: vec![0],
    }
    .write_to(&mut body)
    .expect("read");
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

/// Piece `i` of the file: bytes that differ from every other piece.
fn piece(i: usize) -> Vec<u8> {
    (0..PIECE).map(|n| (n * 7 + i * 131 + n / 251) as u8).collect()
}

/// Sends `messages` back to back, then reads one response each, in the
/// order they arrive.
async fn pipeline(client: &mut TcpStream, messages: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for message in messages {
        encode_frame(message, &mut out).expect("frame");
    }
    client.write_all(&out).await.expect("send");
    let mut responses = Vec::new();
    for _ in messages {
        let mut prefix = [0u8; FRAME_HEADER_LEN];
        client.read_exact(&mut prefix).await.expect("frame header");
        let mut response = vec![0u8; decode_frame_header(&prefix).expect("length") as usize];
        client.read_exact(&mut response).await.expect("frame");
        responses.push(response);
    }
    responses
}

/// The server, its files, a peer with an open f.bin, and a socket to the
/// peer's connection served by the reader and writer tasks.
async fn served_connection() -> (Arc<ServerState>, MemFsBackend, Peer, FileId, TcpStream) {
    let backend = MemFsBackend::new()
        .with_file("f.bin", &vec![0; AT_ONCE * PIECE])
        .with_io_gate(AT_ONCE);
    let state = SmbServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .share(Share::new("home", backend.clone()).public())
        .build()
        .expect("build")
        .state();
    let mut peer = Peer::new(&state, false).await;
    let (_, reply) = peer.request(&state, Command::Create, &create_body()).await;
    assert_eq!(status(&reply), 0, "open f.bin");
    let file_id = CreateResponse::parse(&reply[SMB2_HEADER_LEN..])
        .expect("create response")
        .file_id;

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .expect("connect");
    let (stream, _) = listener.accept().await.expect("accept");
    let (read_half, write_half) = tokio::io::split(stream);
    let (tx, rx) = writer::response_queue();
    peer.conn.outbound.attach(tx.clone());
    tokio::spawn(writer::writer_task(write_half, rx, Duration::from_secs(10)));
    let (server, conn) = (state.clone(), peer.conn.clone());
    tokio::spawn(async move { reader::reader_task(read_half, server, conn, tx).await });
    (state, backend, peer, file_id, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_and_reads_run_at_once_and_close_waits_for_them() {
    let (_state, backend, mut peer, file_id, mut client) = served_connection().await;
    let deadline = Duration::from_secs(10);

    // WRITEs in reverse order, then CLOSE; a serial server would wait at
    // the first WRITE forever.
    let mut messages = Vec::new();
    let mut writes = Vec::new();
    for i in (0..AT_ONCE).rev() {
        let (mid, message) =
            peer.message(Command::Write, &write_body(file_id, (i * PIECE) as u64, piece(i)));
        writes.push(mid);
        messages.push(message);
    }
    let (close_mid, close) = peer.message(Command::Close, &close_body(file_id));
    messages.push(close);
    let responses = tokio::time::timeout(deadline, pipeline(&mut client, &messages))
        .await
        .expect("the WRITEs ran at once");
    for response in &responses[..AT_ONCE] {
        let hdr = header(response);
        assert_eq!(hdr.command, Command::Write);
        assert!(writes.contains(&hdr.message_id));
        assert_eq!(status(response), 0, "WRITE {}", hdr.message_id);
    }
    let last = header(&responses[AT_ONCE]);
    assert_eq!((last.command, last.message_id), (Command::Close, close_mid), "CLOSE answers last");
    assert_eq!(status(&responses[AT_ONCE]), 0);
    let want: Vec<u8> = (0..AT_ONCE).flat_map(piece).collect();
    assert!(backend.contents("f.bin").expect("f.bin") == want, "every WRITE landed in place");

    // Open again: READs at once return each piece; one on a FileId after
    // its CLOSE is refused in order.
    let (_, create) = peer.message(Command::Create, &create_body());
    let reply = tokio::time::timeout(deadline, pipeline(&mut client, &[create]))
        .await
        .expect("CREATE answered");
    assert_eq!(status(&reply[0]), 0);
    let file_id = CreateResponse::parse(&reply[0][SMB2_HEADER_LEN..])
        .expect("create response")
        .file_id;
    let mut messages = Vec::new();
    let mut reads = Vec::new();
    for i in 0..AT_ONCE {
        let (mid, message) = peer.message(Command::Read, &read_body(file_id, (i * PIECE) as u64));
        reads.push((mid, i));
        messages.push(message);
    }
    let (close_mid, close) = peer.message(Command::Close, &close_body(file_id));
    messages.push(close);
    let (late_mid, late) = peer.message(Command::Read, &read_body(file_id, 0));
    messages.push(late);
    let responses = tokio::time::timeout(deadline, pipeline(&mut client, &messages))
        .await
        .expect("the READs ran at once");
    for response in &responses[..AT_ONCE] {
        let hdr = header(response);
        let &(_, i) = reads
            .iter()
            .find(|(mid, _)| *mid == hdr.message_id)
            .expect("a READ's response");
        assert_eq!(status(response), 0);
        let body = ReadResponse::parse(&response[SMB2_HEADER_LEN..]).expect("read response");
        assert!(body.data == piece(i), "READ of piece {i}");
    }
    assert_eq!(header(&responses[AT_ONCE]).message_id, close_mid, "CLOSE after the READs");
    assert_eq!(header(&responses[AT_ONCE + 1]).message_id, late_mid);
    assert_eq!(
        status(&responses[AT_ONCE + 1]),
        crate::ntstatus::STATUS_FILE_CLOSED,
        "a READ after CLOSE finds the file closed"
    );
}
