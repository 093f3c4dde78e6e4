//! One namespace: what S3 writes the engine reads byte for byte, and the reverse.

mod common;

use common::start;
use md5::{Digest, Md5};
use storage_engine::{Caller, Stability};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed).collect()
}

fn http_date(ns: i64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_put_is_read_by_the_engine_and_engine_writes_are_s3_objects() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/data", &[], vec![]).await.0, 200);

    // S3 → engine, for an inline-sized and a striped object.
    for (key, len) in [("small/a.bin", 1000usize), ("deep/er/b.bin", 3 << 20)] {
        let bytes = pattern(len, 7);
        let res = s.signed("PUT", &format!("/data/{key}"), &[], bytes.clone()).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 200);
        let etag = res.headers()["etag"].to_str().unwrap().to_string();
        assert_eq!(etag, format!("\"{}\"", hex::encode(Md5::digest(&bytes))));
        let path = format!("data/{key}");
        let (attr, read) = s
            .with_engine(move |e| {
                let a = e.resolve(&Caller::system(), &path).unwrap();
                let data = e.read(&Caller::system(), a.ino, 0, a.size as usize + 10).unwrap();
                (a, data)
            })
            .await;
        assert_eq!(attr.size, len as u64);
        assert!(read == bytes, "{key}: engine reads other bytes than S3 wrote");
        let head = s.signed("HEAD", &format!("/data/{key}"), &[], vec![]).send().await.unwrap();
        assert_eq!(head.headers()["last-modified"].to_str().unwrap(), http_date(attr.mtime_ns));
        assert_eq!(head.headers()["content-length"].to_str().unwrap(), len.to_string());
    }

    // engine → S3: a file written in place, as NFS or SMB would.
    let bytes = pattern(200_000, 3);
    let b2 = bytes.clone();
    let attr = s
        .with_engine(move |e| {
            let c = Caller::system();
            let d = e.resolve(&c, "data").unwrap();
            let dir = e.mkdir(&c, d.ino, b"nfs", 0o755).unwrap();
            let f = e.create(&c, dir.ino, b"file.bin", 0o644, true).unwrap();
            e.write(&c, f.ino, 0, &b2[..100_000], Stability::Unstable).unwrap();
            e.write(&c, f.ino, 100_000, &b2[100_000..], Stability::Durable).unwrap();
            e.getattr(&c, f.ino).unwrap()
        })
        .await;
    let res = s.signed("GET", "/data/nfs/file.bin", &[], vec![]).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()["etag"].to_str().unwrap(), format!("\"{}\"", hex::encode(Md5::digest(&bytes))));
    assert_eq!(res.headers()["last-modified"].to_str().unwrap(), http_date(attr.mtime_ns));
    assert!(res.bytes().await.unwrap().as_ref() == bytes.as_slice());

    // Rewritten in place (same size) through the engine: the cached ETag must not survive.
    let changed = pattern(200_000, 99);
    let c2 = changed.clone();
    s.with_engine(move |e| {
        let c = Caller::system();
        let f = e.resolve(&c, "data/nfs/file.bin").unwrap();
        e.write(&c, f.ino, 0, &c2, Stability::Durable).unwrap();
    })
    .await;
    let res = s.signed("HEAD", "/data/nfs/file.bin", &[], vec![]).send().await.unwrap();
    assert_eq!(res.headers()["etag"].to_str().unwrap(), format!("\"{}\"", hex::encode(Md5::digest(&changed))));

    // And listed in byte order across directories.
    let (_, body) = s.call("GET", "/data", &[("list-type", "2")], vec![]).await;
    let keys: Vec<&str> = body.split("<Key>").skip(1).map(|k| k.split("</Key>").next().unwrap()).collect();
    assert_eq!(keys, ["deep/er/b.bin", "nfs/file.bin", "small/a.bin"]);
    s.stop().await;
}

/// The keys a ListObjectsV2 answer names, as (Contents, CommonPrefixes).
fn listed(body: &str) -> (Vec<String>, Vec<String>) {
    let between = |tag: &str, s: &str| -> Vec<String> {
        s.split(&format!("<{tag}>")).skip(1).map(|p| p.split(&format!("</{tag}>")).next().unwrap().to_string()).collect()
    };
    let contents = between("Contents", body).iter().flat_map(|c| between("Key", c)).collect();
    let prefixes = between("CommonPrefixes", body).iter().flat_map(|c| between("Prefix", c)).collect();
    (contents, prefixes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_objects_are_directories_listed_as_objects() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/fold", &[], vec![]).await.0, 200);
    let list = |prefix: &'static str, delimiter: &'static str| {
        let s = &s;
        async move {
            let mut q = vec![("list-type", "2"), ("prefix", prefix)];
            if !delimiter.is_empty() {
                q.push(("delimiter", delimiter));
            }
            let (st, body) = s.call("GET", "/fold", &q, vec![]).await;
            assert_eq!(st, 200, "{body}");
            (listed(&body), body)
        }
    };

    // A zero-byte `prefix/` is the directory, and an empty object listed before its contents.
    let res = s.signed("PUT", "/fold/photos/", &[], vec![]).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let empty_md5 = "\"d41d8cd98f00b204e9800998ecf8427e\"";
    assert_eq!(res.headers()["etag"].to_str().unwrap(), empty_md5);
    assert_eq!(s.call("PUT", "/fold/photos/a.jpg", &[], b"jpeg".to_vec()).await.0, 200);
    // A directory made over another protocol is a prefix, not an object.
    s.with_engine(|e| {
        let b = e.resolve(&Caller::system(), "fold").unwrap();
        e.mkdir(&Caller::system(), b.ino, b"plain", 0o755).unwrap();
    })
    .await;
    assert_eq!(s.call("PUT", "/fold/plainer/sub/f", &[], b"f".to_vec()).await.0, 200);
    let ((contents, prefixes), body) = list("", "").await;
    assert_eq!(contents, ["photos/", "photos/a.jpg", "plainer/sub/f"]);
    assert!(prefixes.is_empty());
    let marker = body.split("<Contents>").nth(1).unwrap().split("</Contents>").next().unwrap();
    assert!(marker.contains("<Size>0</Size>") && marker.contains("d41d8cd98f00b204e9800998ecf8427e"), "{marker}");
    assert_eq!(list("photos/", "/").await.0, (vec!["photos/".to_string(), "photos/a.jpg".to_string()], vec![]));
    assert_eq!(list("", "/").await.0, (vec![], vec!["photos/".to_string(), "plainer/".to_string()]));
    // The object's name as S3 shows it: start-after the folder object lists what follows it.
    let (st, body) = s.call("GET", "/fold", &[("list-type", "2"), ("start-after", "photos/")], vec![]).await;
    assert_eq!(st, 200);
    assert_eq!(listed(&body).0, ["photos/a.jpg", "plainer/sub/f"]);
    // DELETE of `prefix/` on a directory that is no folder object changes nothing.
    let ctime = || s.with_engine(|e| e.resolve(&Caller::system(), "fold/plainer").unwrap().ctime_ns);
    let before = ctime().await;
    assert_eq!(s.call("DELETE", "/fold/plainer/", &[], vec![]).await.0, 204);
    assert_eq!(ctime().await, before, "the directory is not touched");
    assert_eq!(list("plainer/", "").await.0 .0, ["plainer/sub/f"]);

    // Removing the last object below it leaves the folder object (and its directory).
    assert_eq!(s.call("DELETE", "/fold/photos/a.jpg", &[], vec![]).await.0, 204);
    assert_eq!(list("photos/", "/").await.0, (vec!["photos/".to_string()], vec![]));
    assert_eq!(list("", "/").await.0 .1, ["photos/", "plainer/"], "an empty folder object is still a common prefix");
    // Deleting the folder object while objects remain below keeps the directory as a prefix.
    assert_eq!(s.call("PUT", "/fold/photos/b.jpg", &[], b"b".to_vec()).await.0, 200);
    assert_eq!(s.call("DELETE", "/fold/photos/", &[], vec![]).await.0, 204);
    assert_eq!(list("photos/", "").await.0 .0, ["photos/b.jpg"]);
    assert_eq!(s.call("DELETE", "/fold/photos/b.jpg", &[], vec![]).await.0, 204);
    assert_eq!(list("", "").await.0 .0, ["plainer/sub/f"], "the directory went with its last object");
    let gone = s.with_engine(|e| e.resolve(&Caller::system(), "fold/photos").is_err()).await;
    assert!(gone, "no folder object and no content: the directory is removed");

    // A folder object holds up to 64 KiB, with its metadata; more is refused whichever way
    // it comes, and changes nothing.
    let res = s.signed("PUT", "/fold/docs/", &[], b"text".to_vec()).header("content-type", "text/plain").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()["etag"].to_str().unwrap(), format!("\"{}\"", hex::encode(Md5::digest(b"text"))));
    let res = s.signed("GET", "/fold/docs/", &[], vec![]).send().await.unwrap();
    assert_eq!(res.headers()["content-type"].to_str().unwrap(), "text/plain");
    assert_eq!(res.bytes().await.unwrap().as_ref(), b"text");
    let res = s.signed("GET", "/fold/docs/", &[], vec![]).header("range", "bytes=1-2").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 206);
    assert_eq!(res.bytes().await.unwrap().as_ref(), b"ex");
    let (st, body) = s.raw("PUT", "/fold/docs/", vec![b'x'; 64 * 1024 + 1]).await;
    assert_eq!((st, common::error_code(&body)), (400, "EntityTooLarge"), "{body}");
    let (st, body) = s.call("GET", "/fold/docs/", &[], vec![]).await;
    assert_eq!((st, body.as_str()), (200, "text"), "a refused PUT changes nothing");
    let ((contents, _), body) = list("docs/", "/").await;
    assert_eq!(contents, ["docs/"]);
    assert!(body.contains("<Size>4</Size>"), "{body}");
    let res = s.signed("PUT", "/fold/docs/", &[], b"other".to_vec()).header("if-none-match", "*").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 501, "conditional writes of folder objects are not supported");
    assert_eq!(s.call("GET", "/fold/docs/", &[], vec![]).await, (200, "text".to_string()));
    // A multipart upload of a folder object: its parts' bytes become the content.
    let (st, body) = s.call("POST", "/fold/notes/", &[("uploads", "")], vec![]).await;
    assert_eq!(st, 200, "{body}");
    let id = body.split("<UploadId>").nth(1).unwrap().split("</UploadId>").next().unwrap().to_string();
    let (st, body) = s.call("PUT", "/fold/notes/", &[("partNumber", "1"), ("uploadId", &id)], vec![b'y'; 64 * 1024 + 1]).await;
    assert_eq!((st, common::error_code(&body)), (400, "EntityTooLarge"), "{body}");
    let (st, body) = s.call("PUT", "/fold/notes/", &[("partNumber", "1"), ("uploadId", &id)], b"remember".to_vec()).await;
    assert_eq!(st, 200, "{body}");
    let xml = b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part></CompleteMultipartUpload>".to_vec();
    let (st, body) = s.call("POST", "/fold/notes/", &[("uploadId", &id)], xml).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(s.call("GET", "/fold/notes/", &[], vec![]).await, (200, "remember".to_string()));
    assert_eq!(list("", "").await.0 .0, ["docs/", "notes/", "plainer/sub/f"]);
    // ListObjectVersions shows folder objects as the `null` versions of their keys.
    let (st, body) = s.call("GET", "/fold", &[("versions", "")], vec![]).await;
    assert_eq!(st, 200, "{body}");
    let keys: Vec<&str> = body.split("<Version>").skip(1).map(|v| v.split("<Key>").nth(1).unwrap().split("</Key>").next().unwrap()).collect();
    assert_eq!(keys, ["docs/", "notes/", "plainer/sub/f"], "{body}");
    let notes = body.split("<Version>").nth(2).unwrap();
    assert!(notes.contains("<VersionId>null</VersionId>") && notes.contains("<Size>8</Size>"), "{notes}");
    let (st, body) = s.call("GET", "/fold", &[("uploads", "")], vec![]).await;
    assert_eq!(st, 200);
    assert!(!body.contains("<Upload>"), "the completed upload is gone: {body}");
    // Deleting a folder object drops its content and metadata with the mark.
    assert_eq!(s.call("PUT", "/fold/docs/inner", &[], b"i".to_vec()).await.0, 200);
    assert_eq!(s.call("DELETE", "/fold/docs/", &[], vec![]).await.0, 204);
    let (st, body) = s.call("GET", "/fold/docs/", &[], vec![]).await;
    assert_eq!((st, body.as_str()), (200, ""), "the directory remains, no longer a folder object");
    assert_eq!(list("docs/", "").await.0 .0, ["docs/inner"]);
    // A bucket holding a folder object is not empty.
    let (st, body) = s.call("DELETE", "/fold", &[], vec![]).await;
    assert_eq!((st, common::error_code(&body)), (409, "BucketNotEmpty"), "{body}");
    s.stop().await;
}

/// A large GET reads the object in windows of several stripes, two in flight: the whole
/// object and ranges across the windows' edges come back byte for byte, and an object cut
/// short while it is read ends the body early instead of sending other bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_gets_read_ahead_in_windows_and_stop_at_a_shrunken_object() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/win", &[], vec![]).await.0, 200);
    const MIB: usize = 1 << 20;
    let bytes = pattern(45 * MIB + 123, 3);
    let res = s.signed("PUT", "/win/big", &[], bytes.clone()).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let got = s.signed("GET", "/win/big", &[], vec![]).send().await.unwrap().bytes().await.unwrap();
    assert!(got[..] == bytes[..], "a whole GET returns the object");
    // The first read is one stripe (4 MiB), the next ones 16 MiB: ranges across 4, 20 and 36 MiB.
    for (a, b) in [(0, 10), (4 * MIB - 5, 4 * MIB + 5), (3 * MIB, 39 * MIB), (20 * MIB - 1, 20 * MIB), (36 * MIB, 45 * MIB + 122)] {
        let res = s.signed("GET", "/win/big", &[], vec![]).header("range", format!("bytes={a}-{b}")).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 206);
        let got = res.bytes().await.unwrap();
        assert!(got[..] == bytes[a..=b], "range {a}-{b}");
    }
    // Cut short while it is read: the body ends early (an error for the client), never with
    // bytes that are not the object's.
    let mut res = s.signed("GET", "/win/big", &[], vec![]).send().await.unwrap();
    let first = res.chunk().await.unwrap().unwrap();
    assert!(first[..] == bytes[..first.len()]);
    s.with_engine(|e| {
        let a = e.resolve(&Caller::system(), "win/big").unwrap();
        e.setattr(&Caller::system(), a.ino, storage_engine::SetAttr { size: Some(MIB as u64), ..Default::default() }).unwrap();
    })
    .await;
    let mut got = first.to_vec();
    let ended = loop {
        match res.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    assert!(got[..] == bytes[..got.len()], "only the object's bytes, in order");
    assert!(ended.is_err() || got.len() == bytes.len(), "a body cut short ends in an error ({} of {} bytes)", got.len(), bytes.len());
}
