//! S3 bucket versioning over the wire: boto3 through the whole API, what other protocols see
//! (only the current version, as a file), space freed by deleting versions, and bad input
//! refused without changing anything.

mod common;

use std::path::PathBuf;

use common::{Server, error_code, start};
use storage_engine::{Caller, NewUser, ROOT_INO};

fn versioning(status: &str) -> Vec<u8> {
    format!("<VersioningConfiguration><Status>{status}</Status></VersioningConfiguration>").into_bytes()
}

async fn status_of(s: &Server, bucket: &str) -> String {
    let (code, body) = s.call("GET", &format!("/{bucket}"), &[("versioning", "")], vec![]).await;
    assert_eq!(code, 200, "{body}");
    body.split("<Status>").nth(1).and_then(|r| r.split("</Status>").next()).unwrap_or("").to_string()
}

/// The `x-amz-version-id` of a PUT.
async fn put(s: &Server, path: &str, body: Vec<u8>) -> Option<String> {
    let res = s.signed("PUT", path, &[], body).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    res.headers().get("x-amz-version-id").map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_versioning_suite_passes() {
    let ok = std::process::Command::new("python3").args(["-c", "import boto3"]).output().is_ok_and(|o| o.status.success());
    assert!(ok, "`python3 -c 'import boto3'` does not work: install boto3 (pip install boto3)");
    let s = start().await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/versioning_boto3.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .env("ENDPOINT", s.endpoint())
        .env("ACCESS", &s.access)
        .env("SECRET", &s.secret)
        .output()
        .await
        .expect("run python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "versioning suite failed:\n{text}");
    assert_eq!(s.used_bytes().await, 0, "every version deleted: no stripe left");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_protocols_see_only_the_current_version_and_deleted_versions_free_their_space() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/vbk", &[], vec![]).await.0, 200);
    let (code, body) = s.call("PUT", "/vbk", &[("versioning", "")], versioning("Enabled")).await;
    assert_eq!(code, 200, "{body}");
    let big = |seed: u8| (0..300_000u32).map(|i| (i as u8).wrapping_mul(seed)).collect::<Vec<u8>>();
    let mut ids = Vec::new();
    for seed in 1..=3u8 {
        ids.push(put(&s, "/vbk/d/obj", big(seed)).await.expect("a version id"));
    }
    let with_three = s.used_bytes().await;
    // The namespace holds one file, the newest version; the older ones are no files.
    let (names, content) = s
        .with_engine(|e| {
            let c = Caller::system();
            let d = e.resolve(&c, "/vbk/d").unwrap();
            let names: Vec<Vec<u8>> = e.readdir(&c, d.ino, None, 100).unwrap().entries.into_iter().map(|e| e.name).collect();
            let f = e.resolve(&c, "/vbk/d/obj").unwrap();
            (names, e.read(&c, f.ino, 0, f.size as usize).unwrap())
        })
        .await;
    assert_eq!(names, vec![b"obj".to_vec()]);
    assert_eq!(content, big(3));

    // A delete marker removes the file; the versions stay and keep their space.
    let res = s.signed("DELETE", "/vbk/d/obj", &[], vec![]).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 204);
    assert_eq!(res.headers().get("x-amz-delete-marker").map(|v| v.to_str().unwrap()), Some("true"));
    let marker = res.headers().get("x-amz-version-id").unwrap().to_str().unwrap().to_string();
    assert!(s.with_engine(|e| e.resolve(&Caller::system(), "/vbk/d/obj").is_err()).await);
    // GET answers NoSuchKey naming the marker; GET of the marker itself is not allowed.
    for (q, status) in [(vec![], 404), (vec![("versionId", marker.as_str())], 405)] {
        let res = s.signed("GET", "/vbk/d/obj", &q, vec![]).send().await.unwrap();
        assert_eq!(res.status().as_u16(), status);
        assert_eq!(res.headers().get("x-amz-delete-marker").map(|v| v.to_str().unwrap()), Some("true"));
        assert_eq!(res.headers().get("x-amz-version-id").map(|v| v.to_str().unwrap()), Some(marker.as_str()));
    }
    assert_eq!(s.used_bytes().await, with_three);

    // The bucket cannot be removed, over S3 or as a directory, while versions remain.
    let (code, body) = s.call("DELETE", "/vbk", &[], vec![]).await;
    assert_eq!((code, error_code(&body)), (409, "BucketNotEmpty"), "{body}");
    assert!(s.with_engine(|e| e.rmdir(&Caller::system(), ROOT_INO, b"vbk")).await.is_err());

    // Deleting a noncurrent version frees its stripes; deleting all frees everything.
    assert_eq!(s.call("DELETE", "/vbk/d/obj", &[("versionId", &ids[0])], vec![]).await.0, 204);
    assert!(s.used_bytes().await < with_three);
    for id in [&ids[1], &ids[2], &marker] {
        assert_eq!(s.call("DELETE", "/vbk/d/obj", &[("versionId", id)], vec![]).await.0, 204);
    }
    assert_eq!(s.used_bytes().await, 0, "no stripe leaked");
    assert_eq!(s.call("DELETE", "/vbk", &[], vec![]).await.0, 204);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_versioning_requests_are_refused_and_change_nothing() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bad", &[], vec![]).await.0, 200);
    assert_eq!(status_of(&s, "bad").await, "", "never versioned: no status");
    for (doc, want) in [
        (versioning("enabled"), "MalformedXML"),
        (versioning("Off"), "MalformedXML"),
        (b"<VersioningConfiguration></VersioningConfiguration>".to_vec(), "MalformedXML"),
        (b"<VersioningConfiguration><Status>Enabled".to_vec(), "MalformedXML"),
    ] {
        let (code, body) = s.call("PUT", "/bad", &[("versioning", "")], doc).await;
        assert_eq!((code, error_code(&body)), (400, want), "{body}");
        assert_eq!(status_of(&s, "bad").await, "");
    }
    let (code, body) = s
        .call("PUT", "/bad", &[("versioning", "")], b"<VersioningConfiguration><Status>Enabled</Status><MfaDelete>Enabled</MfaDelete></VersioningConfiguration>".to_vec())
        .await;
    assert_eq!((code, error_code(&body)), (501, "NotImplemented"), "{body}");
    assert_eq!(status_of(&s, "bad").await, "");

    assert_eq!(s.call("PUT", "/bad", &[("versioning", "")], versioning("Enabled")).await.0, 200);
    assert_eq!(status_of(&s, "bad").await, "Enabled");
    let v1 = put(&s, "/bad/k", b"one".to_vec()).await.expect("a version id");

    // Only the owner changes or reads the versioning state.
    let (bob_access, bob_secret) = s
        .with_engine(|e| {
            e.create_user(&Caller::system(), NewUser { name: "bob".into(), password: "bob-password".into(), uid: None, gid: None, groups: vec![], role: None }).unwrap();
            e.create_s3_key(&Caller::system(), "bob", None).unwrap()
        })
        .await;
    let res = s.signed_with("PUT", "/bad", &[("versioning", "")], versioning("Suspended"), &bob_access, &bob_secret).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(status_of(&s, "bad").await, "Enabled");
    // Nor may another user delete a version of an object that is not theirs... nor add a
    // delete marker in a bucket they may not write.
    let res = s.signed_with("DELETE", "/bad/k", &[("versionId", &v1)], vec![], &bob_access, &bob_secret).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    let res = s.signed_with("DELETE", "/bad/k", &[], vec![], &bob_access, &bob_secret).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);

    // Version ids that cannot be, and ones that do not exist.
    for q in ["x", "NULL", "0123", &"G".repeat(32)] {
        for method in ["GET", "HEAD", "DELETE"] {
            let res = s.signed(method, "/bad/k", &[("versionId", q)], vec![]).send().await.unwrap();
            assert_eq!(res.status().as_u16(), 400, "{method} versionId={q}");
        }
    }
    let (code, body) = s.call("GET", "/bad/k", &[("versionId", &"0".repeat(32))], vec![]).await;
    assert_eq!((code, error_code(&body)), (404, "NoSuchVersion"), "{body}");
    let (code, body) = s.call("GET", "/bad", &[("versions", ""), ("version-id-marker", &v1)], vec![]).await;
    assert_eq!((code, error_code(&body)), (400, "InvalidArgument"), "a version marker needs a key marker: {body}");
    // Nothing changed: the one version is still there and current.
    let res = s.signed("GET", "/bad/k", &[], vec![]).send().await.unwrap();
    assert_eq!(res.headers().get("x-amz-version-id").unwrap().to_str().unwrap(), v1);
    assert_eq!(res.text().await.unwrap(), "one");
    let (_, listing) = s.call("GET", "/bad", &[("versions", "")], vec![]).await;
    assert_eq!(listing.matches("<Version>").count(), 1, "{listing}");
    assert_eq!(listing.matches("<DeleteMarker>").count(), 0, "{listing}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_expires_noncurrent_versions_and_lone_delete_markers() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/lcv", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/lcv", &[("versioning", "")], versioning("Enabled")).await.0, 200);
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(put(&s, "/lcv/old/a", format!("a{i}").into_bytes()).await.unwrap());
    }
    let keep: Vec<String> = [put(&s, "/lcv/keep/b", b"b0".to_vec()).await.unwrap(), put(&s, "/lcv/keep/b", b"b1".to_vec()).await.unwrap()].into();
    put(&s, "/lcv/gone/c", b"c0".to_vec()).await.unwrap();
    assert_eq!(s.call("DELETE", "/lcv/gone/c", &[], vec![]).await.0, 204);
    let rules = b"<LifecycleConfiguration>\
        <Rule><ID>old</ID><Filter><Prefix>old/</Prefix></Filter><Status>Enabled</Status>\
          <NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays><NewerNoncurrentVersions>1</NewerNoncurrentVersions></NoncurrentVersionExpiration></Rule>\
        <Rule><ID>gone</ID><Filter><Prefix>gone/</Prefix></Filter><Status>Enabled</Status>\
          <Expiration><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration>\
          <NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration></Rule>\
        </LifecycleConfiguration>"
        .to_vec();
    let (code, body) = s.call("PUT", "/lcv", &[("lifecycle", "")], rules).await;
    assert_eq!(code, 200, "{body}");
    let versions_of = |prefix: &'static str| {
        let sr = &s;
        async move {
            let (_, body) = sr.call("GET", "/lcv", &[("versions", ""), ("prefix", prefix)], vec![]).await;
            body.split("<VersionId>").skip(1).map(|p| p.split("</VersionId>").next().unwrap().to_string()).collect::<Vec<_>>()
        }
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let pass = |at: i64| s.with_engine(move |e| aquifer_s3::lifecycle_pass(e, at));
    assert_eq!(pass(now).await, 0, "nothing is noncurrent for a day yet");
    assert_eq!(versions_of("gone/").await.len(), 2);
    // Three days on: old/a keeps its current and its newest noncurrent version; gone/c loses
    // its one version and then its delete marker, now alone; keep/b has no rule.
    assert_eq!(pass(now + 3 * 86_400).await, 3);
    assert_eq!(versions_of("old/").await, vec![old[2].clone(), old[1].clone()]);
    assert_eq!(versions_of("keep/").await, vec![keep[1].clone(), keep[0].clone()]);
    assert!(versions_of("gone/").await.is_empty());
    assert_eq!(pass(now + 30 * 86_400).await, 0, "the newest noncurrent version is kept however old");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_opens_old_versions_only_with_the_version_actions() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/pver", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/pver", &[("versioning", "")], versioning("Enabled")).await.0, 200);
    let old = put(&s, "/pver/k", b"old".to_vec()).await.unwrap();
    let new = put(&s, "/pver/k", b"new".to_vec()).await.unwrap();
    let policy = |actions: &str| {
        format!(r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":"*","Action":{actions},"Resource":"arn:aws:s3:::pver/*"}}]}}"#).into_bytes()
    };
    let anon = |q: Option<&str>| {
        let url = match q {
            Some(v) => format!("{}/pver/k?versionId={v}", s.endpoint()),
            None => format!("{}/pver/k", s.endpoint()),
        };
        s.http.get(url).send()
    };
    assert_eq!(s.call("PUT", "/pver", &[("policy", "")], policy(r#""s3:GetObject""#)).await.0, 204);
    let res = anon(None).await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.text().await.unwrap(), "new");
    assert_eq!(anon(Some(&old)).await.unwrap().status().as_u16(), 403, "s3:GetObject does not cover old versions");
    assert_eq!(anon(Some(&new)).await.unwrap().status().as_u16(), 403, "nor a version named by id");
    assert_eq!(s.call("PUT", "/pver", &[("policy", "")], policy(r#"["s3:GetObject","s3:GetObjectVersion"]"#)).await.0, 204);
    let res = anon(Some(&old)).await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.text().await.unwrap(), "old");
    // Deleting a version takes s3:DeleteObjectVersion, which the policy does not give.
    let res = s.http.delete(format!("{}/pver/k?versionId={old}", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(s.call("GET", "/pver/k", &[("versionId", &old)], vec![]).await.0, 200, "still there");

    // Another user copies from the bucket: an old version takes s3:GetObjectVersion.
    let (bob_access, bob_secret) = s
        .with_engine(|e| {
            e.create_user(&Caller::system(), NewUser { name: "bob".into(), password: "bob-password".into(), uid: None, gid: None, groups: vec![], role: None }).unwrap();
            e.create_s3_key(&Caller::system(), "bob", None).unwrap()
        })
        .await;
    let bob = |method: &str, path: &str, query: &[(&str, &str)], headers: Vec<(&'static str, String)>, body: Vec<u8>| {
        let mut r = s.signed_with(method, path, query, body, &bob_access, &bob_secret);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r.send()
    };
    assert_eq!(bob("PUT", "/bobs", &[], vec![], vec![]).await.unwrap().status().as_u16(), 200);
    let copy = |v: &str| bob("PUT", "/bobs/copy", &[], vec![("x-amz-copy-source", format!("/pver/k?versionId={v}"))], vec![]);
    assert_eq!(s.call("PUT", "/pver", &[("policy", "")], policy(r#""s3:GetObject""#)).await.0, 204);
    assert_eq!(bob("PUT", "/bobs/copy", &[], vec![("x-amz-copy-source", "/pver/k".into())], vec![]).await.unwrap().status().as_u16(), 200);
    assert_eq!(copy(&old).await.unwrap().status().as_u16(), 403, "an old version is not s3:GetObject's");
    assert_eq!(s.call("PUT", "/pver", &[("policy", "")], policy(r#"["s3:GetObject","s3:GetObjectVersion"]"#)).await.0, 204);
    assert_eq!(copy(&old).await.unwrap().status().as_u16(), 200);
    let res = bob("GET", "/bobs/copy", &[], vec![], vec![]).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "old");

    // DeleteObjects: a version takes s3:DeleteObjectVersion, key by key.
    let both = |actions: &str| {
        format!(r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":"*","Action":{actions},"Resource":["arn:aws:s3:::pver","arn:aws:s3:::pver/*"]}}]}}"#).into_bytes()
    };
    assert_eq!(s.call("PUT", "/pver", &[("policy", "")], both(r#""s3:DeleteObject""#)).await.0, 204);
    let del = format!("<Delete><Object><Key>k</Key><VersionId>{old}</VersionId></Object></Delete>").into_bytes();
    let res = bob("POST", "/pver", &[("delete", "")], vec![], del.clone()).await.unwrap();
    let text = res.text().await.unwrap();
    assert!(text.contains("<Error>") && text.contains("AccessDenied"), "{text}");
    assert_eq!(s.call("GET", "/pver/k", &[("versionId", &old)], vec![]).await.0, 200, "still there");
    assert_eq!(s.call("PUT", "/pver", &[("policy", "")], both(r#"["s3:DeleteObject","s3:DeleteObjectVersion"]"#)).await.0, 204);
    let text = bob("POST", "/pver", &[("delete", "")], vec![], del).await.unwrap().text().await.unwrap();
    assert!(text.contains("<Deleted>") && !text.contains("<Error>"), "{text}");
    assert_eq!(s.call("GET", "/pver/k", &[("versionId", &old)], vec![]).await.0, 404, "gone");
    s.stop().await;
}
