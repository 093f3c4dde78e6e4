//! Namespace behaviour through the engine API: every call a protocol makes.

mod common;

use common::*;
use storage_engine::*;

fn user(e: &Engine, name: &str) -> Caller {
    let info = e
        .create_user(&root(), NewUser { name: name.into(), password: "password-123".into(), ..Default::default() })
        .expect("create user");
    e.authenticate_password(name, "password-123").map(|c| {
        assert_eq!(c.uid, info.uid);
        c
    }).expect("authenticate")
}

#[test]
fn files_dirs_links_and_rename() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let d = e.mkdir(&c, ROOT_INO, b"data", 0o755).unwrap();
    assert_eq!(e.getattr(&c, ROOT_INO).unwrap().nlink, 3);
    let f = e.create(&c, d.ino, b"a.bin", 0o644, true).unwrap();
    assert!(matches!(e.create(&c, d.ino, b"a.bin", 0o644, true), Err(Error::Exists)));
    assert_eq!(e.create(&c, d.ino, b"a.bin", 0o644, false).unwrap().ino, f.ino);
    let payload = bytes(1, 300_000);
    e.write(&c, f.ino, 0, &payload, Stability::Durable).unwrap();
    assert_eq!(e.read(&c, f.ino, 0, 1 << 20).unwrap(), payload);
    assert_eq!(e.read(&c, f.ino, 12_345, 100).unwrap(), payload[12_345..12_445]);
    // Overwrite in the middle, across a stripe boundary (stripes are 64 KiB here).
    let patch = bytes(2, 10_000);
    e.write(&c, f.ino, 60_000, &patch, Stability::Durable).unwrap();
    let mut want = payload.clone();
    want[60_000..70_000].copy_from_slice(&patch);
    assert_eq!(e.read(&c, f.ino, 0, 1 << 20).unwrap(), want);

    // Hard link, symlink, rename across directories.
    let d2 = e.mkdir(&c, ROOT_INO, b"other", 0o755).unwrap();
    e.link(&c, f.ino, d2.ino, b"hard").unwrap();
    assert_eq!(e.getattr(&c, f.ino).unwrap().nlink, 2);
    let s = e.symlink(&c, d2.ino, b"sym", b"../data/a.bin").unwrap();
    assert_eq!(e.readlink(&c, s.ino).unwrap(), b"../data/a.bin");
    e.rename(&c, d.ino, b"a.bin", d2.ino, b"moved.bin").unwrap();
    assert!(matches!(e.lookup(&c, d.ino, b"a.bin"), Err(Error::NotFound)));
    assert_eq!(get(&e, "/other/moved.bin"), want);
    e.unlink(&c, d2.ino, b"moved.bin").unwrap();
    assert_eq!(get(&e, "/other/hard"), want, "data lives while a link remains");
    e.unlink(&c, d2.ino, b"hard").unwrap();
    assert!(matches!(e.getattr(&c, f.ino), Err(Error::NotFound)));

    // A directory cannot move below itself; rmdir needs an empty directory.
    let sub = e.mkdir(&c, d.ino, b"sub", 0o755).unwrap();
    assert!(e.rename(&c, ROOT_INO, b"data", sub.ino, b"loop").is_err());
    assert!(matches!(e.rmdir(&c, ROOT_INO, b"data"), Err(Error::NotEmpty)));
    e.rmdir(&c, d.ino, b"sub").unwrap();
    e.rmdir(&c, ROOT_INO, b"data").unwrap();
    assert_eq!(e.getattr(&c, ROOT_INO).unwrap().nlink, 3);
}

#[test]
fn bad_names_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let before = e.getattr(&c, ROOT_INO).unwrap();
    let long = vec![b'x'; 256];
    let cases: Vec<(&[u8], NameProblem)> = vec![
        (b"", NameProblem::Empty),
        (b".", NameProblem::Dot),
        (b"..", NameProblem::Dot),
        (b"a/b", NameProblem::Slash),
        (b"a\0b", NameProblem::Nul),
        (&long, NameProblem::TooLong),
    ];
    for (name, problem) in cases {
        match e.create(&c, ROOT_INO, name, 0o644, true) {
            Err(Error::InvalidName(p)) => assert_eq!(p, problem),
            other => panic!("create {name:?}: {other:?}"),
        }
        assert!(matches!(e.mkdir(&c, ROOT_INO, name, 0o755), Err(Error::InvalidName(_))));
    }
    assert!(e.mkdir(&c, ROOT_INO, &vec![b'y'; 255], 0o755).is_ok(), "255 bytes is allowed");
    e.rmdir(&c, ROOT_INO, &vec![b'y'; 255]).unwrap();
    let after = e.getattr(&c, ROOT_INO).unwrap();
    assert_eq!(after.nlink, before.nlink);
    assert!(e.readdir(&c, ROOT_INO, None, 100).unwrap().entries.is_empty());
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    assert!(matches!(e.write(&c, f.ino, FILE_BYTES_MAX, b"x", Stability::Durable), Err(Error::FileTooLarge)));
    assert!(matches!(e.write(&c, f.ino, u64::MAX - 1, b"xy", Stability::Durable), Err(Error::FileTooLarge)));
    assert_eq!(e.getattr(&c, f.ino).unwrap().size, 0);
}

#[test]
fn permissions_are_enforced_by_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let alice = user(&e, "alice");
    let bob = user(&e, "bob");
    let home = e.mkdir(&c, ROOT_INO, b"alice", 0o755).unwrap();
    e.setattr(&c, home.ino, SetAttr { uid: Some(alice.uid), gid: Some(alice.gid), ..Default::default() }).unwrap();
    let f = e.create(&alice, home.ino, b"private", 0o600, true).unwrap();
    e.write(&alice, f.ino, 0, b"secret", Stability::Durable).unwrap();
    assert!(matches!(e.read(&bob, f.ino, 0, 10), Err(Error::PermissionDenied)));
    assert!(matches!(e.write(&bob, f.ino, 0, b"x", Stability::Durable), Err(Error::PermissionDenied)));
    assert!(matches!(e.create(&bob, home.ino, b"intruder", 0o644, true), Err(Error::PermissionDenied)));
    assert!(matches!(e.unlink(&bob, home.ino, b"private"), Err(Error::PermissionDenied)));
    assert!(matches!(e.setattr(&bob, f.ino, SetAttr { mode: Some(0o666), ..Default::default() }), Err(Error::PermissionDenied)));
    assert!(matches!(e.setattr(&alice, f.ino, SetAttr { uid: Some(bob.uid), ..Default::default() }), Err(Error::PermissionDenied)));
    assert_eq!(e.read(&alice, f.ino, 0, 10).unwrap(), b"secret");
    // Sticky directory: bob may create but not delete alice's file.
    let tmp = e.mkdir(&c, ROOT_INO, b"tmp", 0o1777).unwrap();
    e.create(&alice, tmp.ino, b"mine", 0o644, true).unwrap();
    assert!(matches!(e.unlink(&bob, tmp.ino, b"mine"), Err(Error::PermissionDenied)));
    e.create(&bob, tmp.ino, b"his", 0o644, true).unwrap();
    e.unlink(&bob, tmp.ino, b"his").unwrap();
    // Roles gate admin operations.
    assert!(matches!(e.list_users(&bob), Err(Error::PermissionDenied)));
    assert!(matches!(e.create_user(&bob, NewUser { name: "eve".into(), password: "password-1".into(), ..Default::default() }), Err(Error::PermissionDenied)));
    assert!(matches!(e.authenticate_password("alice", "wrong-password"), Err(Error::Unauthenticated)));
    assert!(matches!(e.authenticate_password("nobody", "password-123"), Err(Error::Unauthenticated)));
}

/// `write_as_owner` and `setattr_as_owner`: the owner of a read-only file writes and resizes
/// it (what a server whose clients checked access at open needs), nobody else does, and
/// nothing else about the file is overridden.
#[test]
fn the_owner_override_covers_writes_and_size_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let alice = user(&e, "alice");
    let bob = user(&e, "bob");
    let shared = e.mkdir(&c, ROOT_INO, b"shared", 0o777).unwrap();
    let f = e.create(&alice, shared.ino, b"ro", 0o444, true).unwrap();
    let size = |a: &Caller| e.getattr(a, f.ino).unwrap().size;
    assert!(matches!(e.write(&alice, f.ino, 0, b"x", Stability::Durable), Err(Error::PermissionDenied)));
    assert!(matches!(e.setattr(&alice, f.ino, SetAttr { size: Some(9), ..Default::default() }), Err(Error::PermissionDenied)));
    assert!(matches!(e.try_write_buffered(&alice, f.ino, 0, b"x"), Err(Error::PermissionDenied)));
    assert_eq!(size(&alice), 0);

    e.write_as_owner(&alice, f.ino, 0, b"written ", Stability::Unstable).unwrap();
    assert!(e.try_write_buffered_as_owner(&alice, f.ino, 8, b"read-only").unwrap());
    e.commit(&alice, f.ino).unwrap();
    assert_eq!(e.read(&alice, f.ino, 0, 100).unwrap(), b"written read-only");
    e.setattr_as_owner(&alice, f.ino, SetAttr { size: Some(7), ..Default::default() }).unwrap();
    assert_eq!(e.try_setattr_as_owner(&alice, f.ino, SetAttr { size: Some(9), ..Default::default() }).unwrap().unwrap().size, 9);
    assert_eq!(e.read(&alice, f.ino, 0, 100).unwrap(), b"written\0\0");

    // Another user meets the mode, with or without the override.
    assert!(matches!(e.write_as_owner(&bob, f.ino, 0, b"x", Stability::Durable), Err(Error::PermissionDenied)));
    assert!(matches!(e.try_write_buffered_as_owner(&bob, f.ino, 0, b"x"), Err(Error::PermissionDenied)));
    assert!(matches!(e.setattr_as_owner(&bob, f.ino, SetAttr { size: Some(0), ..Default::default() }), Err(Error::PermissionDenied)));
    assert!(matches!(e.try_setattr_as_owner(&bob, f.ino, SetAttr { size: Some(0), ..Default::default() }), Some(Err(Error::PermissionDenied))));
    // Only the size: a change of owner stays the administrator's, the mode stays the owner's.
    assert!(matches!(e.setattr_as_owner(&alice, f.ino, SetAttr { size: Some(1), uid: Some(bob.uid), ..Default::default() }), Err(Error::PermissionDenied)));
    assert!(matches!(e.setattr_as_owner(&bob, f.ino, SetAttr { mode: Some(0o666), ..Default::default() }), Err(Error::PermissionDenied)));
    let a = e.getattr(&c, f.ino).unwrap();
    assert_eq!((a.size, a.mode & 0o777, a.uid), (9, 0o444, alice.uid));
}

#[test]
fn tokens_issue_use_expire_and_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let admin = e.authenticate_password("admin", "admin-password").unwrap();
    assert_eq!(admin.uid, 0);
    let (tok, info) = e.create_token(&admin, None, Some(Role::ReadOnly), None, "ci").unwrap();
    let c = e.authenticate_token(&tok).unwrap();
    assert_eq!(c.role, Role::ReadOnly);
    assert!(e.authenticate_token(&format!("{tok}x")).is_err());
    assert!(e.authenticate_token("aqf_nothing_here").is_err());
    assert_eq!(e.list_tokens(&admin).unwrap().len(), 1);
    e.revoke_token(&admin, &info.id).unwrap();
    assert!(matches!(e.authenticate_token(&tok), Err(Error::Unauthenticated)));
}

#[test]
fn truncate_extend_and_sparse_reads() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    let data = bytes(3, 200_000);
    e.write(&c, f.ino, 0, &data, Stability::Durable).unwrap();
    e.setattr(&c, f.ino, SetAttr { size: Some(100_001), ..Default::default() }).unwrap();
    e.setattr(&c, f.ino, SetAttr { size: Some(150_000), ..Default::default() }).unwrap();
    let got = e.read(&c, f.ino, 0, 1 << 20).unwrap();
    assert_eq!(got.len(), 150_000);
    assert_eq!(&got[..100_001], &data[..100_001]);
    assert!(got[100_001..].iter().all(|b| *b == 0), "extended range reads as zeros");
    // A hole far past the end.
    e.write(&c, f.ino, 1_000_000, b"tail", Stability::Durable).unwrap();
    let a = e.getattr(&c, f.ino).unwrap();
    assert_eq!(a.size, 1_000_004);
    assert_eq!(e.read(&c, f.ino, 999_998, 100).unwrap(), b"\0\0tail");
    // Inline file grows out of metadata.
    let g = e.create(&c, ROOT_INO, b"g", 0o644, true).unwrap();
    e.write(&c, g.ino, 0, b"small", Stability::Durable).unwrap();
    let big = bytes(4, 50_000);
    e.write(&c, g.ino, 10, &big, Stability::Durable).unwrap();
    let got = e.read(&c, g.ino, 0, 1 << 20).unwrap();
    assert_eq!(&got[..5], b"small");
    assert_eq!(&got[10..], &big[..]);
}

#[test]
fn unstable_writes_are_visible_before_commit_and_durable_after() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(5, 700_000);
    {
        let e = open(dir.path());
        let c = root();
        let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
        for (i, chunk) in data.chunks(32 * 1024).enumerate() {
            e.write(&c, f.ino, (i * 32 * 1024) as u64, chunk, Stability::Unstable).unwrap();
        }
        assert_eq!(e.getattr(&c, f.ino).unwrap().size, data.len() as u64);
        assert_eq!(e.read(&c, f.ino, 0, 1 << 20).unwrap(), data);
        e.commit(&c, f.ino).unwrap();
        e.shutdown().unwrap();
    }
    let e = open(dir.path());
    assert_eq!(get(&e, "/f"), data);
}

#[test]
fn readdir_pages_resume_from_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let mut names: Vec<String> = (0..250).map(|i| format!("n{i:04}")).collect();
    for n in &names {
        e.create(&c, ROOT_INO, n.as_bytes(), 0o644, true).unwrap();
    }
    names.sort();
    let mut seen = Vec::new();
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let page = e.readdir(&c, ROOT_INO, cursor.as_deref(), 64).unwrap();
        seen.extend(page.entries.iter().map(|x| String::from_utf8(x.name.clone()).unwrap()));
        match page.next_cursor {
            Some(cur) => cursor = Some(cur),
            None => break,
        }
    }
    assert_eq!(seen, names);
}

#[test]
fn xattrs_and_statfs() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    e.setxattr(&c, f.ino, b"user.k", b"v").unwrap();
    assert_eq!(e.getxattr(&c, f.ino, b"user.k").unwrap(), b"v");
    assert_eq!(e.listxattr(&c, f.ino).unwrap(), vec![b"user.k".to_vec()]);
    e.removexattr(&c, f.ino, b"user.k").unwrap();
    assert!(matches!(e.getxattr(&c, f.ino, b"user.k"), Err(Error::NotFound)));
    assert!(e.setxattr(&c, f.ino, b"user.big", &vec![0; 70_000]).is_err());
    // Several at once: removals (absent names passed over), then sets, all or nothing.
    e.setxattr(&c, f.ino, b"user.old", b"1").unwrap();
    e.setxattr(&c, f.ino, b"user.again", b"2").unwrap();
    e.set_xattrs(&c, f.ino, &[b"user.old", b"user.absent", b"user.again"], &[(b"user.a", b"x"), (b"user.again", b"3")]).unwrap();
    let mut names = e.listxattr(&c, f.ino).unwrap();
    names.sort();
    assert_eq!(names, vec![b"user.a".to_vec(), b"user.again".to_vec()]);
    assert_eq!(e.getxattr(&c, f.ino, b"user.again").unwrap(), b"3", "a name removed and set ends up set");
    let before = e.getattr(&c, f.ino).unwrap();
    let bad = e.set_xattrs(&c, f.ino, &[b"user.a"], &[(b"user.b", b"y"), (b"user.big", &vec![0; 70_000])]);
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    assert_eq!(e.getxattr(&c, f.ino, b"user.a").unwrap(), b"x", "a refused change removes nothing");
    assert!(matches!(e.getxattr(&c, f.ino, b"user.b"), Err(Error::NotFound)), "and sets nothing");
    let alice = user(&e, "alice");
    assert!(matches!(e.set_xattrs(&alice, f.ino, &[], &[(b"user.c", b"z")]), Err(Error::PermissionDenied)));
    assert!(matches!(e.set_xattrs(&alice, f.ino, &[b"trusted.x"], &[]), Err(Error::PermissionDenied)));
    assert_eq!(e.getattr(&c, f.ino).unwrap().ctime_ns, before.ctime_ns, "refusals change no time");
    for n in [b"user.a".as_slice(), b"user.again"] {
        e.removexattr(&c, f.ino, n).unwrap();
    }
    let s = e.statfs(&c).unwrap();
    assert!(s.total_bytes > 0 && s.free_bytes <= s.total_bytes);
    assert_eq!(s.files, 2);
}

#[test]
fn change_events_follow_mutations() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let mut rx = e.subscribe();
    let c = root();
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    e.write(&c, f.ino, 0, b"hello", Stability::Durable).unwrap();
    e.rename(&c, ROOT_INO, b"f", ROOT_INO, b"g").unwrap();
    let kinds: Vec<ChangeKind> = (0..3).map(|_| rx.try_recv().unwrap().kind).collect();
    assert!(matches!(kinds[0], ChangeKind::Created { .. }));
    assert_eq!(kinds[1], ChangeKind::Data);
    assert!(matches!(kinds[2], ChangeKind::Renamed { .. }));
}

#[test]
fn s3_keys_map_to_users() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let admin = root();
    let alice = user(&e, "alice");
    let (ak, sk) = e.create_s3_key(&alice, "alice", None).unwrap();
    let (secret, c) = e.s3_credentials(&ak).unwrap();
    assert_eq!(secret, sk);
    assert_eq!(c.uid, alice.uid);
    assert!(matches!(e.create_s3_key(&alice, "admin", None), Err(Error::PermissionDenied)));
    e.create_s3_key(&admin, "admin", Some(("ADMINKEY", "admin-secret-1"))).unwrap();
    assert!(matches!(e.create_s3_key(&admin, "admin", Some(("ADMINKEY", "other-secret"))), Err(Error::Exists)));
    assert!(e.create_s3_key(&admin, "admin", Some(("bad key!", "admin-secret-1"))).is_err());
    assert_eq!(e.list_s3_keys(&admin).unwrap().len(), 2);
    assert_eq!(e.list_s3_keys(&alice).unwrap().len(), 1);
    e.delete_s3_key(&alice, &ak).unwrap();
    assert!(matches!(e.s3_credentials(&ak), Err(Error::Unauthenticated)));
}

#[test]
fn ssh_keys_and_access_checks() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let alice = user(&e, "alice");
    let line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPkxDfaWnWQ6Rb1bOy8a1tTXGlHe5cRP1tUjZ7kBKf2V alice@laptop";
    let id = e.add_ssh_key(&alice, "alice", line).unwrap();
    assert_eq!(e.ssh_keys_of("alice").unwrap(), vec![(id.clone(), line.to_string())]);
    assert!(e.add_ssh_key(&alice, "admin", line).is_err(), "users add keys only for themselves");
    assert!(e.add_ssh_key(&alice, "alice", "not a key").is_err());
    e.delete_ssh_key(&alice, "alice", &id).unwrap();
    assert!(e.ssh_keys_of("alice").unwrap().is_empty());
    let f = e.create(&root(), ROOT_INO, b"ro", 0o644, true).unwrap();
    assert_eq!(e.access(&alice, f.ino, 7).unwrap(), 4);
    assert_eq!(e.access(&root(), f.ino, 7).unwrap(), 6);
    assert_eq!(e.access(&alice, ROOT_INO, 7).unwrap(), 5);
}

#[test]
fn special_files_have_no_data_and_devices_need_root() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let alice = user(&e, "alice");
    let tmp = e.mkdir(&root(), ROOT_INO, b"tmp", 0o1777).unwrap();
    let fifo = e.mknod(&alice, tmp.ino, b"pipe", FileKind::Fifo, 0o640, 99).unwrap();
    assert_eq!(fifo.kind, FileKind::Fifo);
    assert_eq!(fifo.rdev, 0, "only devices carry a device number");
    assert_eq!(fifo.uid, alice.uid);
    assert!(matches!(e.read(&alice, fifo.ino, 0, 10), Err(Error::InvalidArgument(_))));
    assert!(matches!(e.write(&alice, fifo.ino, 0, b"x", Stability::Durable), Err(Error::InvalidArgument(_))));
    assert!(matches!(e.mknod(&alice, tmp.ino, b"dev", FileKind::CharDevice, 0o600, 1 << 32 | 3), Err(Error::PermissionDenied)));
    let dev = e.mknod(&root(), tmp.ino, b"dev", FileKind::BlockDevice, 0o600, (8 << 32) | 1).unwrap();
    assert_eq!(e.lookup(&root(), tmp.ino, b"dev").unwrap().rdev, (8 << 32) | 1);
    assert!(matches!(e.mknod(&root(), tmp.ino, b"plain", FileKind::File, 0o600, 0), Err(Error::InvalidArgument(_))));
    e.rename(&alice, tmp.ino, b"pipe", tmp.ino, b"pipe2").unwrap();
    e.unlink(&alice, tmp.ino, b"pipe2").unwrap();
    e.unlink(&root(), tmp.ino, b"dev").unwrap();
    let _ = dev;
    // Special files are not objects.
    e.mknod(&root(), tmp.ino, b"sock", FileKind::Socket, 0o600, 0).unwrap();
    assert!(e.list_objects(&root(), tmp.ino, b"", None, b"", 100).unwrap().objects.is_empty());
}

#[test]
fn a_replacing_link_swaps_the_name_in_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let a = put(&e, "/a", b"new bytes");
    let old = put(&e, "/b", b"old bytes");
    // Without replacing, an existing name is refused and nothing changes.
    assert!(matches!(e.link(&c, a, ROOT_INO, b"b"), Err(Error::Exists)));
    assert_eq!(get(&e, "/b"), b"old bytes");
    let attr = e.link_replacing(&c, a, ROOT_INO, b"b").unwrap();
    assert_eq!(attr.nlink, 2);
    assert_eq!(get(&e, "/b"), b"new bytes");
    assert_eq!(e.lookup(&c, ROOT_INO, b"b").unwrap().ino, a);
    assert!(matches!(e.getattr(&c, old), Err(Error::NotFound)), "the replaced file had no other name");
    // Linking a file to a name it already has changes nothing.
    assert_eq!(e.link_replacing(&c, a, ROOT_INO, b"b").unwrap().nlink, 2);
    // A directory is never replaced, and another user's file in a sticky directory is not.
    e.mkdir(&c, ROOT_INO, b"d", 0o755).unwrap();
    assert!(matches!(e.link_replacing(&c, a, ROOT_INO, b"d"), Err(Error::IsDir)));
    let tmp = e.mkdir(&c, ROOT_INO, b"tmp", 0o1777).unwrap();
    let bob = user(&e, "bob");
    let mine = e.create(&bob, tmp.ino, b"mine", 0o666, true).unwrap();
    let theirs = e.create(&c, tmp.ino, b"theirs", 0o666, true).unwrap();
    assert!(matches!(e.link_replacing(&bob, mine.ino, tmp.ino, b"theirs"), Err(Error::PermissionDenied)));
    assert_eq!(e.lookup(&c, tmp.ino, b"theirs").unwrap().ino, theirs.ino);
    // After a restart the new name is what was kept.
    e.shutdown().unwrap();
    drop(e);
    let e = open(dir.path());
    assert_eq!(get(&e, "/b"), b"new bytes");
    assert_eq!(e.getattr(&c, a).unwrap().nlink, 2);
}

/// `holds_mirrors` (whether protocols may make their short metadata reads in place) is false
/// until the first portal mirror's stub is stored, by the portal caller only, and stays true
/// across a restart.
#[test]
fn holds_mirrors_from_the_first_stub_on_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    assert!(!e.holds_mirrors());
    let d = e.mkdir(&c, ROOT_INO, b"mirror", 0o755).unwrap();
    let stub = RemoteStub { portal: "p".into(), hub_ino: 7, hub_version: 1, path: Vec::new(), listed: false, cache_ino: 0, present: Vec::new() };
    assert!(matches!(e.remote_stub_put(&c, d.ino, &stub), Err(Error::PermissionDenied)));
    assert!(!e.holds_mirrors(), "a refused stub changes nothing");
    e.remote_stub_put(&Caller::portal(), d.ino, &stub).unwrap();
    assert!(e.holds_mirrors());
    e.shutdown().unwrap();
    drop(e);
    let e = open(dir.path());
    assert!(e.holds_mirrors());
    assert_eq!(e.remote_stub(d.ino).unwrap().map(|s| s.hub_ino), Some(7));
}

/// The event-loop read of a small file answers what `read` and `getattr` answer, and
/// declines (None) whenever a read could wait: bytes still in a write buffer, bytes on the
/// drives, or a portal mirror read by anyone but the portal.
#[test]
fn try_read_inline_answers_as_read_or_declines() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let small = bytes(11, 4096);
    let f = e.create(&c, ROOT_INO, b"small", 0o600, true).unwrap();
    e.write(&c, f.ino, 0, &small, Stability::Unstable).unwrap();
    assert!(e.try_read_inline(&c, f.ino, 0, 4096).is_none(), "bytes in the write buffer: declined");
    e.close(&c, f.ino).unwrap();
    let read = |caller: &Caller, ino: Ino, off: u64, len: usize| e.try_read_inline(caller, ino, off, len).map(|r| r.map(|(data, _)| data));
    let (data, attr) = e.try_read_inline(&c, f.ino, 0, 1 << 20).expect("a small file: answered here").unwrap();
    assert_eq!(data, small);
    let now = e.getattr(&c, f.ino).unwrap();
    assert_eq!((attr.ino, attr.size, attr.mtime_ns, attr.mode), (now.ino, now.size, now.mtime_ns, now.mode), "the attributes getattr gives");
    assert_eq!(read(&c, f.ino, 100, 50).unwrap().unwrap(), &small[100..150]);
    assert_eq!(read(&c, f.ino, 4000, 500).unwrap().unwrap(), &small[4000..]);
    assert!(read(&c, f.ino, 4096, 10).unwrap().unwrap().is_empty(), "at the end of the file");
    assert!(read(&c, f.ino, 0, 0).unwrap().unwrap().is_empty(), "nothing asked");
    assert!(matches!(read(&Caller::anonymous(), f.ino, 0, 10).unwrap(), Err(Error::PermissionDenied)), "mode 0600");
    let d = e.mkdir(&c, ROOT_INO, b"d", 0o755).unwrap();
    assert!(read(&c, d.ino, 0, 10).is_none(), "a directory: left to read, which refuses it");
    assert!(matches!(read(&c, 999_999, 0, 10).unwrap(), Err(Error::NotFound)));
    let large = bytes(12, 3 << 20);
    let g = e.create(&c, ROOT_INO, b"large", 0o644, true).unwrap();
    e.write(&c, g.ino, 0, &large, Stability::Durable).unwrap();
    assert!(read(&c, g.ino, 0, 4096).is_none(), "bytes on the drives: declined");
    assert_eq!(e.read(&c, g.ino, 0, 4096).unwrap(), &large[..4096]);
    // A mirror: the portal reads it here, everyone else is sent where a hub may be asked.
    let stub = RemoteStub { portal: "p".into(), hub_ino: 9, hub_version: 1, path: Vec::new(), listed: false, cache_ino: 0, present: Vec::new() };
    e.remote_stub_put(&Caller::portal(), f.ino, &stub).unwrap();
    assert!(read(&c, f.ino, 0, 10).is_none(), "a portal mirror: declined");
    assert_eq!(read(&Caller::portal(), f.ino, 0, 10).unwrap().unwrap(), &small[..10]);
}

/// The event-loop lookup answers what `lookup` answers for local entries, permission
/// checks and errors included.
#[test]
fn try_lookup_answers_as_lookup_for_local_entries() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let d = e.mkdir(&c, ROOT_INO, b"d", 0o700).unwrap();
    let f = e.create(&c, d.ino, b"f", 0o644, false).unwrap();
    let got = e.try_lookup(&c, d.ino, b"f").expect("local: answered here").unwrap();
    assert_eq!((got.ino, got.size, got.mode), (f.ino, f.size, f.mode));
    assert_eq!(e.try_lookup(&c, d.ino, b"..").unwrap().unwrap().ino, ROOT_INO);
    assert!(matches!(e.try_lookup(&c, d.ino, b"missing").unwrap(), Err(Error::NotFound)));
    assert!(matches!(e.try_lookup(&c, f.ino, b"x").unwrap(), Err(Error::NotDir)));
    let nobody = Caller::anonymous();
    assert!(matches!(e.try_lookup(&nobody, d.ino, b"f").unwrap(), Err(Error::PermissionDenied)), "0700 directory");
}
