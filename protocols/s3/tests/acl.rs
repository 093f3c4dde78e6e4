//! Object ACLs are a view of the file's mode: GetObjectAcl shows the owner's full control and
//! everyone's read when anonymous reads are admitted; PutObjectAcl with `private` or
//! `public-read` (canned, or as a policy body saying exactly that) changes the mode, and
//! a grant to a user that does not exist is refused with nothing changed.

mod common;

use common::{error_code, start};
use storage_engine::{Caller, NewUser};

const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_acls_are_the_file_mode() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/acl", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/acl/dir/o", &[], b"data".to_vec()).await.0, 200);
    let mode = |s: &common::Server| {
        let e = s.engine.clone();
        async move { tokio::task::spawn_blocking(move || e.resolve(&Caller::system(), "/acl/dir/o").unwrap().mode & 0o777).await.unwrap() }
    };
    let alice_uid = s.with_engine(|e| e.caller_for_user("alice").unwrap().uid).await;
    let (code, acl) = s.call("GET", "/acl/dir/o", &[("acl", "")], vec![]).await;
    assert_eq!(code, 200, "{acl}");
    assert!(acl.contains("FULL_CONTROL") && acl.contains(&format!("<ID>{alice_uid}</ID>")), "{acl}");
    assert!(!acl.contains(ALL_USERS), "a private bucket admits no anonymous reads: {acl}");

    // private: only the owner's bits are left.
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], vec![]).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200, "{}", res.text().await.unwrap());
    assert_eq!(mode(&s).await, 0o600);

    // public-read marks the object: anonymous clients read it even in a private bucket, and
    // the ACL says so; private takes the mark away again.
    let url = format!("{}/acl/dir/o", s.endpoint());
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.http.get(&url).send().await.unwrap().text().await.unwrap(), "data");
    let (_, acl) = s.call("GET", "/acl/dir/o", &[("acl", "")], vec![]).await;
    assert!(acl.contains(ALL_USERS), "{acl}");
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], vec![]).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.http.get(&url).send().await.unwrap().status().as_u16(), 403);
    // PutObject with public-read marks it too; its neighbours stay private.
    let res = s.signed("PUT", "/acl/dir/pub", &[], b"open".to_vec()).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.http.get(format!("{}/acl/dir/pub", s.endpoint())).send().await.unwrap().text().await.unwrap(), "open");
    let res = s.http.head(format!("{}/acl/dir/pub", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.http.get(&url).send().await.unwrap().status().as_u16(), 403);
    assert_eq!(s.http.get(format!("{}/acl?list-type=2", s.endpoint())).send().await.unwrap().status().as_u16(), 403, "listing stays private");
    assert_eq!(s.http.put(format!("{}/acl/dir/pub", s.endpoint())).body("x").send().await.unwrap().status().as_u16(), 403, "reads only");

    // public-read in a public-read bucket: anonymous clients read it, and the ACL says so.
    let res = s.signed("PUT", "/acl", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.http.get(&url).send().await.unwrap().status().as_u16(), 403, "still private");
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(mode(&s).await, 0o644);
    assert_eq!(s.http.get(&url).send().await.unwrap().text().await.unwrap(), "data");
    let (_, acl) = s.call("GET", "/acl/dir/o", &[("acl", "")], vec![]).await;
    assert!(acl.contains(ALL_USERS) && acl.contains("<Permission>READ</Permission>"), "{acl}");

    // A policy body that says exactly "private" is accepted.
    let policy = |extra: &str| {
        format!(
            "<AccessControlPolicy><Owner><ID>{alice_uid}</ID></Owner><AccessControlList><Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"CanonicalUser\"><ID>{alice_uid}</ID></Grantee><Permission>FULL_CONTROL</Permission></Grant>{extra}</AccessControlList></AccessControlPolicy>"
        )
        .into_bytes()
    };
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], policy("")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200, "{}", res.text().await.unwrap());
    assert_eq!(mode(&s).await, 0o600);
    assert_eq!(s.http.get(&url).send().await.unwrap().status().as_u16(), 403);

    // Grants to users that do not exist are refused (400) and change nothing; grants the
    // mode view cannot say are stored (tests/acl_grants.rs).
    let other = "<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"CanonicalUser\"><ID>4242</ID></Grantee><Permission>READ</Permission></Grant>";
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], policy(other)).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 400);
    assert_eq!(error_code(&res.text().await.unwrap()), "InvalidArgument");
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], vec![]).header("x-amz-grant-read", "id=4242").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 400);
    let res = s.signed("PUT", "/acl/dir/o", &[("acl", "")], vec![]).header("x-amz-acl", "aws-exec-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 501, "canned ACLs naming AWS services are not supported");
    assert_eq!(mode(&s).await, 0o600);
    let (_, acl) = s.call("GET", "/acl/dir/o", &[("acl", "")], vec![]).await;
    assert!(!acl.contains("4242") && !acl.contains(ALL_USERS), "{acl}");

    // Another user may neither change it nor read its ACL.
    let (bob_access, bob_secret) = s
        .with_engine(|e| {
            let admin = Caller::system();
            e.create_user(&admin, NewUser { name: "bob".into(), password: "bob-password".into(), uid: None, gid: None, groups: vec![], role: None }).unwrap();
            e.create_s3_key(&admin, "bob", None).unwrap()
        })
        .await;
    let res = s.signed_with("PUT", "/acl/dir/o", &[("acl", "")], vec![], &bob_access, &bob_secret).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(error_code(&res.text().await.unwrap()), "AccessDenied");
    assert_eq!(mode(&s).await, 0o600);
    let res = s.signed_with("GET", "/acl/dir/o", &[("acl", "")], vec![], &bob_access, &bob_secret).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    // Listings (v1 always, v2 with fetch-owner) name the owner as the ACL does.
    let (_, v1) = s.call("GET", "/acl", &[], vec![]).await;
    assert!(v1.contains("<DisplayName>alice</DisplayName>") && v1.contains(&format!("<ID>{alice_uid}</ID>")), "{v1}");
    let (_, v2) = s.call("GET", "/acl", &[("list-type", "2"), ("fetch-owner", "true")], vec![]).await;
    assert!(v2.contains("<DisplayName>alice</DisplayName>"), "{v2}");
    let (_, v2) = s.call("GET", "/acl", &[("list-type", "2")], vec![]).await;
    assert!(!v2.contains("<Owner>"), "{v2}");
    // Missing objects answer NoSuchKey.
    let res = s.signed("GET", "/acl/dir/none", &[("acl", "")], vec![]).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(error_code(&res.text().await.unwrap()), "NoSuchKey");
    s.stop().await;
}
