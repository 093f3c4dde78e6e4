//! Object versions of versioned buckets: records kept across restarts, current file
//! replaced and restored, space freed when versions are deleted, listing with markers.

mod common;

use common::*;
use storage_engine::*;

fn put_version(e: &Engine, bucket: Ino, key: &str, data: &[u8], mode: VersionMode) -> String {
    let c = root();
    let (parent, name) = e.object_parent(&c, bucket, key, true).unwrap();
    let staged = e.begin_put(&c, parent, 0o644).unwrap();
    e.write(&c, staged.ino, 0, data, Stability::Unstable).unwrap();
    e.finish_put_versioned(&c, staged.ino, parent, name.as_bytes(), bucket, key, mode).unwrap().1
}

fn read_version(e: &Engine, bucket: Ino, key: &str, id: &str) -> Vec<u8> {
    let a = match e.find_version(&root(), bucket, key, id).unwrap() {
        FoundVersion::Current(a) | FoundVersion::Noncurrent(a) => a,
        FoundVersion::DeleteMarker { .. } => panic!("{key} {id} is a delete marker"),
    };
    e.read(&root(), a.ino, 0, a.size as usize + 1).unwrap()
}

fn all_versions(e: &Engine, bucket: Ino) -> Vec<(String, String, bool, bool)> {
    let page = e.list_versions(&root(), bucket, "", None, "", None, 1000).unwrap();
    assert!(page.next.is_none());
    page.versions.into_iter().map(|v| (v.key, v.id, v.latest, matches!(v.kind, VersionKind::DeleteMarker { .. }))).collect()
}

fn used(e: &Engine) -> u64 {
    e.sync_metadata().unwrap();
    e.drives().iter().map(|d| d.used_bytes).sum()
}

#[test]
fn replaced_versions_are_kept_across_a_restart_and_readable_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2);
    {
        let e = open(dir.path());
        let b = e.mkdir(&root(), ROOT_INO, b"bucket", 0o755).unwrap();
        v1 = put_version(&e, b.ino, "a/obj", &bytes(1, 200_000), VersionMode::Enabled);
        v2 = put_version(&e, b.ino, "a/obj", &bytes(2, 150_000), VersionMode::Enabled);
        assert_ne!(v1, v2);
        assert!(is_version_id(&v1) && v1 != NULL_VERSION);
        assert_eq!(get(&e, "/bucket/a/obj"), bytes(2, 150_000), "the namespace shows the newest version");
        // The old version is no file: the directory holds only the current one.
        let a = e.resolve(&root(), "/bucket/a").unwrap();
        assert_eq!(e.readdir(&root(), a.ino, None, 10).unwrap().entries.len(), 1);
        // Dropped without shutdown, like a killed daemon: orphan reclamation must keep v1.
    }
    let e = open(dir.path());
    let b = e.resolve(&root(), "/bucket").unwrap();
    assert_eq!(read_version(&e, b.ino, "a/obj", &v1), bytes(1, 200_000));
    assert_eq!(read_version(&e, b.ino, "a/obj", &v2), bytes(2, 150_000));
    assert_eq!(all_versions(&e, b.ino), vec![("a/obj".into(), v2.clone(), true, false), ("a/obj".into(), v1.clone(), false, false)]);
    assert!(matches!(e.find_version(&root(), b.ino, "a/obj", "0000000000000000ffffffffffffffff"), Err(Error::NotFound)));
    assert!(matches!(e.find_version(&root(), b.ino, "a/obj", NULL_VERSION), Err(Error::NotFound)));
}

#[test]
fn a_delete_marker_hides_the_key_and_removing_it_brings_the_object_back() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let b = e.mkdir(&root(), ROOT_INO, b"bucket", 0o755).unwrap();
    let v1 = put_version(&e, b.ino, "d/k", b"one", VersionMode::Enabled);
    let marker = e.delete_versioned(&root(), b.ino, "d/k", VersionMode::Enabled).unwrap();
    assert!(e.resolve(&root(), "/bucket/d/k").is_err(), "deleted key is no file");
    assert_eq!(e.latest_delete_marker(&root(), b.ino, "d/k").unwrap(), Some(marker.clone()));
    assert!(matches!(e.find_version(&root(), b.ino, "d/k", &marker).unwrap(), FoundVersion::DeleteMarker { latest: true, .. }));
    assert_eq!(all_versions(&e, b.ino), vec![("d/k".into(), marker.clone(), true, true), ("d/k".into(), v1.clone(), false, false)]);
    e.delete_version(&root(), b.ino, "d/k", &marker).unwrap();
    assert_eq!(get(&e, "/bucket/d/k"), b"one", "the newest object version is current again");
    assert_eq!(e.latest_delete_marker(&root(), b.ino, "d/k").unwrap(), None);
    // Deleting the current version makes the next one current; the last leaves nothing.
    let v2 = put_version(&e, b.ino, "d/k", b"two", VersionMode::Enabled);
    e.delete_version(&root(), b.ino, "d/k", &v2).unwrap();
    assert_eq!(get(&e, "/bucket/d/k"), b"one");
    e.delete_version(&root(), b.ino, "d/k", &v1).unwrap();
    assert!(e.resolve(&root(), "/bucket/d/k").is_err());
    assert!(all_versions(&e, b.ino).is_empty());
    assert!(matches!(e.delete_version(&root(), b.ino, "d/k", &v1), Err(Error::NotFound)));
}

#[test]
fn deleting_versions_frees_their_space_and_a_bucket_with_versions_is_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let b = e.mkdir(&root(), ROOT_INO, b"bucket", 0o755).unwrap();
    assert_eq!(used(&e), 0);
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(put_version(&e, b.ino, "big", &bytes(10 + i, 300_000), VersionMode::Enabled));
    }
    let with_three = used(&e);
    ids.push(e.delete_versioned(&root(), b.ino, "big", VersionMode::Enabled).unwrap());
    assert_eq!(used(&e), with_three, "a delete marker keeps the data");
    assert!(matches!(e.rmdir(&root(), ROOT_INO, b"bucket"), Err(Error::NotEmpty)), "versions remain");
    // Nor may an empty directory be renamed over it (that would drop its versions).
    e.mkdir(&root(), ROOT_INO, b"empty", 0o755).unwrap();
    assert!(matches!(e.rename(&root(), ROOT_INO, b"empty", ROOT_INO, b"bucket"), Err(Error::NotEmpty)));
    e.rmdir(&root(), ROOT_INO, b"empty").unwrap();
    e.delete_version(&root(), b.ino, "big", &ids[1]).unwrap();
    let with_two = used(&e);
    assert!(with_two < with_three, "a deleted version's stripes are freed");
    for id in [&ids[0], &ids[2], &ids[3]] {
        e.delete_version(&root(), b.ino, "big", id).unwrap();
    }
    assert_eq!(used(&e), 0, "no stripe leaked");
    assert!(!e.bucket_has_versions(b.ino).unwrap());
    e.rmdir(&root(), ROOT_INO, b"bucket").unwrap();
    drop(e);
    let e = open(dir.path());
    assert_eq!(used(&e), 0, "none after a restart either");
}

#[test]
fn suspended_writes_replace_the_null_version_and_keep_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let b = e.mkdir(&root(), ROOT_INO, b"bucket", 0o755).unwrap();
    // A file from before versioning is the null version.
    put(&e, "/bucket/k", &bytes(3, 100_000));
    let v1 = put_version(&e, b.ino, "k", b"v1", VersionMode::Enabled);
    assert_eq!(read_version(&e, b.ino, "k", NULL_VERSION), bytes(3, 100_000));
    let before = used(&e);
    assert_eq!(put_version(&e, b.ino, "k", b"null again", VersionMode::Suspended), NULL_VERSION);
    assert!(used(&e) < before, "the old null version was replaced and freed");
    assert_eq!(read_version(&e, b.ino, "k", &v1), b"v1");
    assert_eq!(put_version(&e, b.ino, "k", b"null 3", VersionMode::Suspended), NULL_VERSION);
    let listed = all_versions(&e, b.ino);
    assert_eq!(listed, vec![("k".into(), NULL_VERSION.into(), true, false), ("k".into(), v1.clone(), false, false)]);
    // A suspended delete puts a null delete marker in place of the null version.
    assert_eq!(e.delete_versioned(&root(), b.ino, "k", VersionMode::Suspended).unwrap(), NULL_VERSION);
    assert_eq!(all_versions(&e, b.ino), vec![("k".into(), NULL_VERSION.into(), true, true), ("k".into(), v1, false, false)]);
    assert_eq!(used(&e), 0, "only tiny inline versions remain");
}

#[test]
fn version_listing_pages_through_markers_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let b = e.mkdir(&root(), ROOT_INO, b"bucket", 0o755).unwrap();
    // Keys whose byte order differs from a depth-first walk, with 1-3 versions each.
    let keys = ["a", "a-b", "b/c", "b/d/e", "b-x", "c.txt"];
    for (i, k) in keys.iter().enumerate() {
        for j in 0..=(i % 3) {
            put_version(&e, b.ino, k, format!("{k}{j}").as_bytes(), VersionMode::Enabled);
        }
    }
    e.delete_versioned(&root(), b.ino, "b-x", VersionMode::Enabled).unwrap();
    let full = all_versions(&e, b.ino);
    assert_eq!(full.len(), 1 + 2 + 3 + 1 + 2 + 1 + 3);
    assert!(full[0..3].iter().all(|v| v.0.starts_with('a')) && full[3].0 == "b-x" && full[3].3, "{full:?}");
    let order: Vec<&str> = full.iter().map(|v| v.0.as_str()).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "key byte order");
    for max in [1, 2, 3, 5] {
        let (mut km, mut vm) = (String::new(), None::<String>);
        let mut got = Vec::new();
        loop {
            let p = e.list_versions(&root(), b.ino, "", None, &km, vm.as_deref(), max).unwrap();
            assert!(p.versions.len() <= max);
            got.extend(p.versions.into_iter().map(|v| (v.key, v.id, v.latest, matches!(v.kind, VersionKind::DeleteMarker { .. }))));
            match p.next {
                Some((k, v)) => (km, vm) = (k, v),
                None => break,
            }
        }
        assert_eq!(got, full, "pages of {max}");
    }
    // A page resumes after its marker even when the marked version was deleted meanwhile
    // (the next one becomes current: it is listed all the same).
    let p = e.list_versions(&root(), b.ino, "", None, "", None, 7).unwrap();
    let (km, vm) = p.next.clone().unwrap();
    assert_eq!((km.as_str(), vm.as_ref()), ("b/c", Some(&full[6].1)));
    e.delete_version(&root(), b.ino, &km, vm.as_deref().unwrap()).unwrap();
    let rest = e.list_versions(&root(), b.ino, "", None, &km, vm.as_deref(), 100).unwrap();
    let ids = |v: &[(String, String, bool, bool)]| v.iter().map(|v| (v.0.clone(), v.1.clone())).collect::<Vec<_>>();
    assert_eq!(rest.versions.into_iter().map(|v| (v.key, v.id)).collect::<Vec<_>>(), ids(&full[7..]));
    // Prefix and delimiter.
    let p = e.list_versions(&root(), b.ino, "b", Some("/"), "", None, 100).unwrap();
    assert_eq!(p.common_prefixes, vec!["b/".to_string()]);
    assert_eq!(p.versions.iter().map(|v| v.key.as_str()).collect::<Vec<_>>(), vec!["b-x", "b-x", "b-x"]);
    // A key marker alone skips all of that key.
    let p = e.list_versions(&root(), b.ino, "", None, "b/c", None, 100).unwrap();
    assert_eq!(p.versions.first().map(|v| v.key.as_str()), Some("b/d/e"));
}

#[test]
fn a_version_never_comes_back_over_what_now_holds_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let b = e.mkdir(&root(), ROOT_INO, b"bucket", 0o755).unwrap();
    // Key `k` has two versions and is deleted; `k/x` then makes `k` a directory.
    let v1 = put_version(&e, b.ino, "k", b"one", VersionMode::Enabled);
    let v2 = put_version(&e, b.ino, "k", b"two", VersionMode::Enabled);
    let marker = e.delete_versioned(&root(), b.ino, "k", VersionMode::Enabled).unwrap();
    put_version(&e, b.ino, "k/x", b"below", VersionMode::Enabled);
    // Removing the marker would make v2 current, but `k` is a directory: v2 stays a version.
    e.delete_version(&root(), b.ino, "k", &marker).unwrap();
    assert_eq!(get(&e, "/bucket/k/x"), b"below", "the directory and its files are untouched");
    assert_eq!(read_version(&e, b.ino, "k", &v2), b"two");
    // `j` is a file, so key `j/y` has no place: its versions can still be removed.
    put_version(&e, b.ino, "j/y", b"y", VersionMode::Enabled);
    let y = put_version(&e, b.ino, "j/y", b"y2", VersionMode::Enabled);
    e.delete_versioned(&root(), b.ino, "j/y", VersionMode::Enabled).unwrap();
    let jdir = e.resolve(&root(), "/bucket/j").unwrap();
    assert!(e.readdir(&root(), jdir.ino, None, 10).unwrap().entries.is_empty());
    e.rmdir(&root(), b.ino, b"j").unwrap();
    put(&e, "/bucket/j", b"a file now");
    e.delete_version(&root(), b.ino, "j/y", &y).unwrap();
    assert_eq!(get(&e, "/bucket/j"), b"a file now");
    for id in [&v1, &v2] {
        e.delete_version(&root(), b.ino, "k", id).unwrap();
    }
    assert_eq!(get(&e, "/bucket/k/x"), b"below");
}

/// A key's versions in the model: the current one (the file), then the records newest first
/// (`None` content: a delete marker).
#[derive(Default, Clone, Debug)]
struct ModelKey {
    current: Option<(String, Vec<u8>)>,
    records: Vec<(String, Option<Vec<u8>>)>,
}

impl ModelKey {
    fn drop_null_record(&mut self) {
        self.records.retain(|(id, _)| id != NULL_VERSION);
    }
    /// The current file stops being current (replaced or deleted).
    fn retire(&mut self, mode: VersionMode) {
        if let Some((id, data)) = self.current.take() {
            if id == NULL_VERSION {
                self.drop_null_record();
                if mode == VersionMode::Suspended {
                    return;
                }
            }
            self.records.insert(0, (id, Some(data)));
        }
    }
    fn promote(&mut self) {
        if self.current.is_none() && matches!(self.records.first(), Some((_, Some(_)))) {
            let (id, data) = self.records.remove(0);
            self.current = Some((id, data.expect("an object version")));
        }
    }
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn check_model(e: &Engine, bucket: Ino, model: &std::collections::BTreeMap<&str, ModelKey>, seed: u64, step: usize, contents: bool) {
    let mut want = Vec::new();
    for (k, m) in model {
        if let Some((id, _)) = &m.current {
            want.push((k.to_string(), id.clone(), true, false));
        }
        for (i, (id, data)) in m.records.iter().enumerate() {
            want.push((k.to_string(), id.clone(), i == 0 && m.current.is_none(), data.is_none()));
        }
    }
    assert_eq!(all_versions(e, bucket), want, "seed {seed} step {step}");
    for (k, m) in model {
        let path = format!("/bucket/{k}");
        match &m.current {
            Some((_, data)) => assert_eq!(&get(e, &path), data, "seed {seed} step {step}: {k} in the namespace"),
            None => assert!(e.resolve(&root(), &path).is_err(), "seed {seed} step {step}: {k} is no file"),
        }
        if contents {
            for (id, data) in &m.records {
                if let Some(data) = data {
                    assert_eq!(&read_version(e, bucket, k, id), data, "seed {seed} step {step}: {k} version {id}");
                }
            }
        }
    }
}

/// Random puts, deletes and version removals under Enabled and Suspended, against a model,
/// with restarts; then every version removed, and no stripe may be left.
#[test]
fn random_version_operations_match_a_model() {
    let seeds: u64 = std::env::var("AQUIFER_VERSIONS_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    for seed in 1..=seeds {
        let dir = tempfile::tempdir().unwrap();
        let mut e = open(dir.path());
        let b = e.mkdir(&root(), ROOT_INO, b"bucket", 0o755).unwrap().ino;
        let keys = ["a", "b/c", "b-d", "b/e/f"];
        let mut model: std::collections::BTreeMap<&str, ModelKey> = keys.iter().map(|k| (*k, ModelKey::default())).collect();
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        for step in 0..120 {
            let k = keys[rng.below(keys.len() as u64) as usize];
            let mode = if rng.below(4) == 0 { VersionMode::Suspended } else { VersionMode::Enabled };
            let m = model.get_mut(k).unwrap();
            match rng.below(10) {
                0..=4 => {
                    let len = [10, 5000, 70_000][rng.below(3) as usize];
                    let data = bytes(seed * 1000 + step as u64, len);
                    let id = put_version(&e, b, k, &data, mode);
                    m.retire(mode);
                    if mode == VersionMode::Suspended {
                        assert_eq!(id, NULL_VERSION);
                        m.drop_null_record();
                    }
                    m.current = Some((id, data));
                }
                5..=6 => {
                    let id = e.delete_versioned(&root(), b, k, mode).unwrap();
                    m.retire(mode);
                    if mode == VersionMode::Suspended {
                        m.drop_null_record();
                    }
                    m.records.insert(0, (id, None));
                }
                _ => {
                    let all: Vec<String> = m.current.iter().map(|c| c.0.clone()).chain(m.records.iter().map(|r| r.0.clone())).collect();
                    if all.is_empty() {
                        assert!(matches!(e.delete_version(&root(), b, k, NULL_VERSION), Err(Error::NotFound)));
                        continue;
                    }
                    let id = all[rng.below(all.len() as u64) as usize].clone();
                    e.delete_version(&root(), b, k, &id).unwrap();
                    if m.current.as_ref().is_some_and(|c| c.0 == id) {
                        m.current = None;
                    } else {
                        let pos = m.records.iter().position(|r| r.0 == id).unwrap();
                        m.records.remove(pos);
                        if pos != 0 {
                            check_model(&e, b, &model, seed, step, false);
                            continue;
                        }
                    }
                    m.promote();
                }
            }
            check_model(&e, b, &model, seed, step, step % 10 == 0);
            if step % 40 == 39 {
                drop(e);
                e = open(dir.path());
                check_model(&e, b, &model, seed, step, true);
            }
        }
        for (k, m) in &model {
            for id in m.current.iter().map(|c| c.0.clone()).chain(m.records.iter().map(|r| r.0.clone())) {
                e.delete_version(&root(), b, k, &id).unwrap();
            }
        }
        assert!(all_versions(&e, b).is_empty(), "seed {seed}");
        assert_eq!(used(&e), 0, "seed {seed}: every version removed, no stripe left");
    }
}
