//! Object operations: put-whole, multipart, listing in byte order.

mod common;

use std::collections::BTreeSet;

use common::*;
use storage_engine::*;

fn put_object(e: &Engine, bucket: Ino, key: &str, data: &[u8]) -> Attr {
    let c = root();
    let (parent, name) = e.object_parent(&c, bucket, key, true).unwrap();
    let staged = e.begin_put(&c, parent, 0o644).unwrap();
    e.write(&c, staged.ino, 0, data, Stability::Unstable).unwrap();
    e.finish_put(&c, staged.ino, parent, name.as_bytes()).unwrap()
}

#[test]
fn put_whole_replaces_atomically_and_abort_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let b = e.mkdir(&c, ROOT_INO, b"bucket", 0o755).unwrap();
    put_object(&e, b.ino, "x/y/z.bin", &bytes(1, 100_000));
    let before_used: u64 = e.drives().iter().map(|d| d.used_bytes).sum();
    // Staged but not finished: invisible.
    let (parent, _) = e.object_parent(&c, b.ino, "x/y/z.bin", false).unwrap();
    let staged = e.begin_put(&c, parent, 0o644).unwrap();
    e.write(&c, staged.ino, 0, &bytes(2, 100_000), Stability::Durable).unwrap();
    assert_eq!(get(&e, "/bucket/x/y/z.bin"), bytes(1, 100_000));
    e.abort_put(&c, staged.ino).unwrap();
    e.sync_metadata().unwrap();
    let after_used: u64 = e.drives().iter().map(|d| d.used_bytes).sum();
    assert_eq!(before_used, after_used, "aborted upload's stripes are freed");
    put_object(&e, b.ino, "x/y/z.bin", b"replaced");
    assert_eq!(get(&e, "/bucket/x/y/z.bin"), b"replaced");
}

/// A whole small object as one command: content, extended attributes and the name in one
/// batch, replacing a file, refusing a directory, and durable across a restart.
#[test]
fn put_inline_creates_or_replaces_in_one_command() {
    let dir = tempfile::tempdir().unwrap();
    let (ino, mtime) = {
        let e = open(dir.path());
        let c = root();
        let b = e.mkdir(&c, ROOT_INO, b"bucket", 0o755).unwrap();
        let files = e.statfs(&c).unwrap().files;
        // Replaces a file stored in extents: its stripes are freed.
        put_object(&e, b.ino, "k", &bytes(4, 100_000));
        e.sync_metadata().unwrap();
        assert!(e.drives().iter().any(|d| d.used_bytes > 0));
        let mut seen = None;
        let a = e
            .put_inline(&c, b.ino, b"k", 0o640, b"small body", |size, mtime| {
                seen = Some((size, mtime));
                vec![(b"user.etag".to_vec(), format!("{size}@{mtime}").into_bytes())]
            })
            .unwrap()
            .expect("within the inline limit");
        assert_eq!(seen, Some((10, a.mtime_ns)), "the attributes see the new file's size and time");
        assert_eq!((a.size, a.mode & 0o7777, a.kind), (10, 0o640, FileKind::File));
        assert_eq!(get(&e, "/bucket/k"), b"small body");
        assert_eq!(e.getxattr(&c, a.ino, b"user.etag").unwrap(), format!("10@{}", a.mtime_ns).into_bytes());
        assert_eq!(e.lookup(&c, b.ino, b"k").unwrap().ino, a.ino);
        assert_eq!(e.statfs(&c).unwrap().files, files + 1, "one file replaced by another");
        e.sync_metadata().unwrap();
        assert!(e.drives().iter().all(|d| d.used_bytes == 0), "the replaced file's stripes are freed");
        // A directory of that name is not replaced, and nothing is created.
        e.mkdir(&c, b.ino, b"d", 0o755).unwrap();
        assert!(matches!(e.put_inline(&c, b.ino, b"d", 0o644, b"x", |_, _| vec![]), Err(Error::IsDir)));
        assert!(matches!(e.put_inline(&c, b.ino, b"a/b", 0o644, b"x", |_, _| vec![]), Err(Error::InvalidName(_))));
        assert!(matches!(e.put_inline(&c, b.ino, b"x", 0o644, b"x", |_, _| vec![(vec![], vec![])]), Err(Error::InvalidArgument(_))));
        assert_eq!(e.statfs(&c).unwrap().files, files + 2);
        // Over the inline limit: not done, for the caller to stage instead.
        assert!(e.put_inline(&c, b.ino, b"big", 0o644, &bytes(5, 5000), |_, _| vec![]).unwrap().is_none());
        assert!(matches!(e.lookup(&c, b.ino, b"big"), Err(Error::NotFound)));
        (a.ino, a.mtime_ns)
    };
    let e = open(dir.path());
    let c = root();
    assert_eq!(get(&e, "/bucket/k"), b"small body");
    let a = e.getattr(&c, ino).unwrap();
    assert_eq!((a.size, a.mtime_ns), (10, mtime));
    assert_eq!(e.getxattr(&c, ino, b"user.etag").unwrap(), format!("10@{mtime}").into_bytes());
}

/// Polls `f` on this thread until it is ready, parking in between.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// `try_put_inline` (for callers on an event loop) stores what `put_inline` stores, without
/// the log sync, which `durable` then waits for without blocking; the log-sync thread runs
/// it as soon as someone waits, not at its next interval. It declines, with nothing stored,
/// what `put_inline` would not store, and refuses what it refuses.
#[test]
fn try_put_inline_stores_and_durable_waits_for_the_log_sync() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // Only a waiter could wake the log-sync thread within the test's time.
    cfg.wal_sync_interval_ms = 3_600_000;
    let ino = {
        let e = Engine::open(cfg.clone()).unwrap();
        let c = root();
        let b = e.mkdir(&c, ROOT_INO, b"bucket", 0o755).unwrap();
        let a = e
            .try_put_inline(&c, b.ino, b"k", 0o640, b"small body", |size, mtime| vec![(b"user.etag".to_vec(), format!("{size}@{mtime}").into_bytes())])
            .expect("nothing to wait for")
            .unwrap();
        assert_eq!((a.size, a.mode & 0o7777), (10, 0o640));
        assert_eq!(get(&e, "/bucket/k"), b"small body");
        let start = std::time::Instant::now();
        block_on(e.durable()).unwrap();
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "waited for the sync interval");
        // Replacing works as with put_inline.
        let again = e.try_put_inline(&c, b.ino, b"k", 0o640, b"second", |_, _| vec![]).unwrap().unwrap();
        assert_eq!(again.size, 6);
        assert_eq!(get(&e, "/bucket/k"), b"second");
        block_on(e.durable()).unwrap();
        // Too large: declined, nothing stored; refusals as put_inline's.
        assert!(e.try_put_inline(&c, b.ino, b"big", 0o644, &bytes(5, 5000), |_, _| vec![]).is_none());
        assert!(matches!(e.lookup(&c, b.ino, b"big"), Err(Error::NotFound)));
        e.mkdir(&c, b.ino, b"d", 0o755).unwrap();
        assert!(matches!(e.try_put_inline(&c, b.ino, b"d", 0o644, b"x", |_, _| vec![]), Some(Err(Error::IsDir))));
        assert!(matches!(e.try_put_inline(&c, b.ino, b"x", 0o644, b"x", |_, _| vec![(vec![], vec![])]), Some(Err(Error::InvalidArgument(_)))));
        again.ino
    };
    let e = Engine::open(cfg).unwrap();
    assert_eq!(get(&e, "/bucket/k"), b"second");
    assert_eq!(e.getattr(&root(), ino).unwrap().size, 6);
}

#[test]
fn staged_files_left_by_a_crash_are_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = open(dir.path());
        let c = root();
        let staged = e.begin_put(&c, ROOT_INO, 0o644).unwrap();
        e.write(&c, staged.ino, 0, &bytes(3, 200_000), Stability::Durable).unwrap();
        assert!(e.drives().iter().any(|d| d.used_bytes > 0));
        // Dropped without shutdown or abort, like a killed daemon.
    }
    let e = open(dir.path());
    e.sync_metadata().unwrap();
    assert!(e.drives().iter().all(|d| d.used_bytes == 0), "orphan stripes reclaimed: {:?}", e.drives().iter().map(|d| d.used_bytes).collect::<Vec<_>>());
    assert_eq!(e.statfs(&root()).unwrap().files, 1);
}

/// A bucket removed with uploads in progress: `multipart_abort_bucket` frees them, and if the
/// daemon stops before it runs, the next start drops the records and reclaims the parts.
#[test]
fn uploads_of_a_removed_bucket_are_freed_now_or_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let c = root();
    let upload = |e: &Engine, bucket: Ino, key: &str| {
        let id = e.multipart_create(&c, bucket, key, vec![]).unwrap();
        let a = e.multipart_part_begin(&c, &id, 1).unwrap();
        e.write(&c, a.ino, 0, &bytes(5, 150_000), Stability::Unstable).unwrap();
        e.multipart_part_finish(&c, &id, 1, a.ino, vec![]).unwrap();
        id
    };
    {
        let e = open(dir.path());
        let kept = e.mkdir(&c, ROOT_INO, b"kept", 0o755).unwrap();
        upload(&e, kept.ino, "stays");
        let b = e.mkdir(&c, ROOT_INO, b"b1", 0o755).unwrap();
        upload(&e, b.ino, "x");
        upload(&e, b.ino, "d/y");
        e.rmdir(&c, ROOT_INO, b"b1").unwrap();
        assert_eq!(e.multipart_abort_bucket(b.ino).unwrap(), 2);
        assert_eq!(e.multipart_abort_bucket(b.ino).unwrap(), 0);
        assert_eq!(e.multipart_list_uploads(&c, kept.ino).unwrap().len(), 1);
        // Removed without the abort, then the daemon stops.
        let b2 = e.mkdir(&c, ROOT_INO, b"b2", 0o755).unwrap();
        upload(&e, b2.ino, "z");
        e.rmdir(&c, ROOT_INO, b"b2").unwrap();
    }
    let e = open(dir.path());
    let kept = e.resolve(&c, "/kept").unwrap();
    let live = e.multipart_list_uploads(&c, kept.ino).unwrap();
    assert_eq!(live.len(), 1, "the upload into an existing bucket stays");
    e.multipart_abort(&c, &live[0].id).unwrap();
    e.sync_metadata().unwrap();
    assert!(e.drives().iter().all(|d| d.used_bytes == 0), "{:?}", e.drives().iter().map(|d| d.used_bytes).collect::<Vec<_>>());
}

#[test]
fn multipart_concatenates_without_copying_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let b = e.mkdir(&c, ROOT_INO, b"bkt", 0o755).unwrap();
    let id = e.multipart_create(&c, b.ino, "deep/obj", b"meta".to_vec()).unwrap();
    let parts: Vec<Vec<u8>> = (1..=4).map(|i| bytes(i, 70_000 + i as usize * 1000)).collect();
    for (i, p) in parts.iter().enumerate() {
        let a = e.multipart_part_begin(&c, &id, i as u32 + 1).unwrap();
        e.write(&c, a.ino, 0, p, Stability::Unstable).unwrap();
        e.multipart_part_finish(&c, &id, i as u32 + 1, a.ino, format!("tag{i}").into_bytes()).unwrap();
    }
    // Re-upload part 2; the first version is dropped.
    let a = e.multipart_part_begin(&c, &id, 2).unwrap();
    let p2 = bytes(99, 5000);
    e.write(&c, a.ino, 0, &p2, Stability::Unstable).unwrap();
    e.multipart_part_finish(&c, &id, 2, a.ino, b"tag-new".to_vec()).unwrap();
    let listed = e.multipart_list_parts(&c, &id).unwrap();
    assert_eq!(listed.iter().map(|p| p.number).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    assert_eq!(listed[1].tag, b"tag-new");
    assert_eq!(e.multipart_list_uploads(&c, b.ino).unwrap().len(), 1);
    assert!(matches!(e.multipart_complete(&c, &id, &[1, 5], &[]), Err(Error::InvalidArgument(_))));
    assert!(matches!(e.multipart_complete(&c, &id, &[2, 1], &[]), Err(Error::InvalidArgument(_))));
    // Complete with parts 1, 2 and 4; part 3 is discarded.
    e.multipart_complete(&c, &id, &[1, 2, 4], &[(b"user.etag".to_vec(), b"abc-3".to_vec())]).unwrap();
    let obj = e.resolve(&c, "/bkt/deep/obj").unwrap();
    assert_eq!(obj.mode & 0o777, 0o644);
    assert_eq!(e.getxattr(&c, obj.ino, b"user.etag").unwrap(), b"abc-3");
    // Published with a given mode (a private canned ACL): 0600 from the first moment.
    let id2 = e.multipart_create(&c, b.ino, "private", vec![]).unwrap();
    let a = e.multipart_part_begin(&c, &id2, 1).unwrap();
    e.write(&c, a.ino, 0, b"secret", Stability::Unstable).unwrap();
    e.multipart_part_finish(&c, &id2, 1, a.ino, b"t".to_vec()).unwrap();
    let private = e.multipart_complete_with_mode(&c, &id2, &[1], &[], 0o600).unwrap();
    assert_eq!(private.mode & 0o777, 0o600);
    assert_eq!(get(&e, "/bkt/private"), b"secret");
    e.unlink(&c, b.ino, b"private").unwrap();
    // Attributes computed from the assembled data (an ETag naming its size and time) are
    // set before publishing, and publishing keeps that size and time.
    let id3 = e.multipart_create(&c, b.ino, "named", vec![]).unwrap();
    for n in 1..=2u32 {
        let a = e.multipart_part_begin(&c, &id3, n).unwrap();
        e.write(&c, a.ino, 0, &bytes(n.into(), 6000), Stability::Unstable).unwrap();
        e.multipart_part_finish(&c, &id3, n, a.ino, vec![]).unwrap();
    }
    let mut seen = None;
    let (named, version) = e
        .multipart_complete_versioned(
            &c,
            &id3,
            &[1, 2],
            |a| {
                seen = Some((a.ino, a.size, a.mtime_ns));
                vec![(b"user.state".to_vec(), format!("{}@{}", a.size, a.mtime_ns).into_bytes())]
            },
            0o644,
            None,
        )
        .unwrap();
    assert_eq!(version, None);
    assert_eq!(seen, Some((named.ino, 12_000, named.mtime_ns)));
    let now = e.resolve(&c, "/bkt/named").unwrap();
    assert_eq!((now.size, now.mtime_ns), (12_000, named.mtime_ns));
    assert_eq!(e.getxattr(&c, now.ino, b"user.state").unwrap(), format!("12000@{}", now.mtime_ns).into_bytes());
    e.unlink(&c, b.ino, b"named").unwrap();
    let mut want = parts[0].clone();
    want.extend_from_slice(&p2);
    want.extend_from_slice(&parts[3]);
    assert_eq!(get(&e, "/bkt/deep/obj"), want);
    assert!(e.multipart_list_uploads(&c, b.ino).unwrap().is_empty());
    assert!(matches!(e.multipart_get(&c, &id), Err(Error::NotFound)));
    // Only the object's stripes remain after the discarded part is freed.
    e.unlink(&c, e.resolve(&c, "/bkt/deep").unwrap().ino, b"obj").unwrap();
    e.sync_metadata().unwrap();
    assert!(e.drives().iter().all(|d| d.used_bytes == 0));

    // Abort frees everything.
    let id = e.multipart_create(&c, b.ino, "k", vec![]).unwrap();
    let a = e.multipart_part_begin(&c, &id, 1).unwrap();
    e.write(&c, a.ino, 0, &bytes(7, 90_000), Stability::Unstable).unwrap();
    e.multipart_part_finish(&c, &id, 1, a.ino, vec![]).unwrap();
    e.multipart_abort(&c, &id).unwrap();
    e.sync_metadata().unwrap();
    assert!(e.drives().iter().all(|d| d.used_bytes == 0));
    assert!(matches!(e.multipart_part_begin(&c, &id, 1), Err(Error::NotFound)));
}

/// Every listing is checked against the same keys sorted as bytes.
#[test]
fn list_objects_matches_byte_order_with_prefix_delimiter_and_paging() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let b = e.mkdir(&c, ROOT_INO, b"b", 0o755).unwrap();
    let keys = [
        "a-b", "a.txt", "a/b", "a/b/c", "a/bc", "a/b-", "a0", "b/x", "b/y/z", "ab/c", "a!", "z", "a/b/c/d/e",
    ];
    // A key cannot be both a file and a directory ("a/b" and "a/b/c"): keep the directory.
    let keys: Vec<&str> = keys.into_iter().filter(|k| *k != "a/b").collect();
    let keys: Vec<&str> = keys.into_iter().filter(|k| *k != "a/b/c").collect();
    for k in &keys {
        put_object(&e, b.ino, k, k.as_bytes());
    }
    let model: BTreeSet<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
    let list_all = |prefix: &str, delim: Option<&str>, page: usize| {
        let mut objects = Vec::new();
        let mut prefixes = Vec::new();
        let mut after = Vec::new();
        loop {
            let p = e.list_objects(&c, b.ino, prefix.as_bytes(), delim.map(|d| d.as_bytes()), &after, page).unwrap();
            objects.extend(p.objects.iter().map(|o| o.key.clone()));
            prefixes.extend(p.common_prefixes.clone());
            match p.next_start_after {
                Some(a) => after = a,
                None => break,
            }
        }
        (objects, prefixes)
    };
    for page in [1, 2, 3, 100] {
        for prefix in ["", "a", "a/", "a/b", "b", "zz"] {
            let (objs, cps) = list_all(prefix, None, page);
            let want: Vec<Vec<u8>> = model.iter().filter(|k| k.starts_with(prefix.as_bytes())).cloned().collect();
            assert_eq!(objs, want, "prefix {prefix:?} page {page}");
            assert!(cps.is_empty());
            let (objs, cps) = list_all(prefix, Some("/"), page);
            let mut want_objs = Vec::new();
            let mut want_cps: Vec<Vec<u8>> = Vec::new();
            for k in model.iter().filter(|k| k.starts_with(prefix.as_bytes())) {
                let rest = &k[prefix.len()..];
                match rest.iter().position(|x| *x == b'/') {
                    Some(i) => {
                        let cp = k[..prefix.len() + i + 1].to_vec();
                        if want_cps.last() != Some(&cp) {
                            want_cps.push(cp);
                        }
                    }
                    None => want_objs.push(k.clone()),
                }
            }
            assert_eq!(objs, want_objs, "delimited objects, prefix {prefix:?} page {page}");
            assert_eq!(cps, want_cps, "common prefixes, prefix {prefix:?} page {page}");
        }
    }
}

/// The listing against a sorted model over random keys whose names extend one another with
/// bytes on both sides of '/' ('-', '.', '0', 'a'), from random start_after values (not
/// only ones a page returned), prefixes, delimiters and page sizes.
#[test]
fn list_objects_matches_a_model_from_any_start_after() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rng = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    const ALPHABET: &[u8] = b"ab-.0";
    for round in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let e = open(dir.path());
        let c = root();
        let b = e.mkdir(&c, ROOT_INO, b"b", 0o755).unwrap();
        let mut model: BTreeSet<Vec<u8>> = BTreeSet::new();
        while model.len() < 60 {
            let depth = 1 + rng(3);
            let segs: Vec<Vec<u8>> = (0..depth).map(|_| (0..1 + rng(3)).map(|_| ALPHABET[rng(ALPHABET.len())]).collect()).collect();
            if segs.iter().any(|s| s == b"." || s == b"..") {
                continue;
            }
            let key = segs.join(&b'/');
            // A name is a file or a directory, not both.
            let clash = model.iter().any(|k| {
                let (short, long) = if k.len() < key.len() { (k, &key) } else { (&key, k) };
                short == long || (long.starts_with(short) && long[short.len()] == b'/')
            });
            if !clash {
                put_object(&e, b.ino, std::str::from_utf8(&key).unwrap(), &key);
                model.insert(key);
            }
        }
        // Folder objects (`d/`, directories listed as objects), on directories that hold
        // keys and on new empty ones.
        let mut folders = 0;
        while folders < 8 {
            let depth = 1 + rng(2);
            let segs: Vec<Vec<u8>> = (0..depth).map(|_| (0..1 + rng(3)).map(|_| ALPHABET[rng(ALPHABET.len())]).collect()).collect();
            if segs.iter().any(|s| s == b"." || s == b"..") {
                continue;
            }
            let path = segs.join(&b'/');
            // No file on the way: not the directory itself, nor one of its parents.
            if model.iter().any(|k| !k.ends_with(b"/") && (*k == path || (path.starts_with(k) && path[k.len()] == b'/'))) {
                continue;
            }
            let mut dir = b.ino;
            for seg in &segs {
                dir = match e.lookup(&c, dir, seg) {
                    Ok(a) => a.ino,
                    Err(_) => e.mkdir(&c, dir, seg, 0o755).unwrap().ino,
                };
            }
            e.setxattr(&c, dir, XATTR_FOLDER_OBJECT, &segs[0]).unwrap();
            let mut key = path;
            key.push(b'/');
            if model.insert(key) {
                folders += 1;
            }
        }
        let random = |rng: &mut dyn FnMut(usize) -> usize, max_len: usize| -> Vec<u8> {
            let alphabet = b"ab-.0/";
            (0..rng(max_len + 1)).map(|_| alphabet[rng(alphabet.len())]).collect()
        };
        for query in 0..150 {
            let prefix = if rng(3) == 0 { Vec::new() } else { random(&mut rng, 3) };
            let start_after = if rng(4) == 0 { Vec::new() } else { random(&mut rng, 7) };
            let delimiter: Option<&[u8]> = [None, Some(&b"/"[..]), Some(&b"-"[..]), Some(&b"a/"[..])][rng(4)];
            let page = [1, 2, 7, 1000][rng(4)];
            let mut want: Vec<(bool, Vec<u8>)> = Vec::new();
            for k in model.iter().filter(|k| k.starts_with(&prefix) && **k > start_after) {
                let rest = &k[prefix.len()..];
                let cp = delimiter.and_then(|d| rest.windows(d.len()).position(|w| w == d).map(|i| k[..prefix.len() + i + d.len()].to_vec()));
                match cp {
                    Some(cp) if cp <= start_after => {}
                    Some(cp) => {
                        if want.last() != Some(&(true, cp.clone())) {
                            want.push((true, cp));
                        }
                    }
                    None => want.push((false, k.clone())),
                }
            }
            let mut got: Vec<(bool, Vec<u8>)> = Vec::new();
            let mut after = start_after.clone();
            loop {
                let p = e.list_objects(&c, b.ino, &prefix, delimiter, &after, page).unwrap();
                assert!(p.objects.len() + p.common_prefixes.len() <= page);
                let mut entries: Vec<(bool, Vec<u8>)> = p.objects.iter().map(|o| (false, o.key.clone())).collect();
                entries.extend(p.common_prefixes.iter().map(|cp| (true, cp.clone())));
                entries.sort_by(|x, y| x.1.cmp(&y.1));
                got.extend(entries);
                match p.next_start_after {
                    Some(a) => after = a,
                    None => break,
                }
            }
            let show = |v: &[(bool, Vec<u8>)]| v.iter().map(|(cp, k)| format!("{}{}", if *cp { "cp:" } else { "" }, String::from_utf8_lossy(k))).collect::<Vec<_>>();
            assert_eq!(
                show(&got),
                show(&want),
                "round {round} query {query}: prefix {:?} start_after {:?} delimiter {:?} page {page}",
                String::from_utf8_lossy(&prefix),
                String::from_utf8_lossy(&start_after),
                delimiter.map(String::from_utf8_lossy)
            );
        }
    }
}
