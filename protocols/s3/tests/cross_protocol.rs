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
