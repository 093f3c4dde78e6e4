//! ACL grants to other users and to groups: stored with the bucket or object, checked when
//! put (an unknown grantee changes nothing), read back by Get*Acl, and enforced for every
//! request: a grant lets its grantee act with the owner's permissions, taking it away
//! refuses them again, and a bucket policy's Deny still wins.

mod common;

use common::{Server, error_code, start};
use storage_engine::{Caller, NewUser};

const AUTHENTICATED: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";

struct User {
    uid: u32,
    access: String,
    secret: String,
}

async fn bob(s: &Server) -> User {
    s.with_engine(|e| {
        let admin = Caller::system();
        e.create_user(&admin, NewUser { name: "bob".into(), password: "bob-password".into(), uid: None, gid: None, groups: vec![], role: None }).unwrap();
        let (access, secret) = e.create_s3_key(&admin, "bob", None).unwrap();
        User { uid: e.caller_for_user("bob").unwrap().uid, access, secret }
    })
    .await
}

async fn alice_uid(s: &Server) -> u32 {
    s.with_engine(|e| e.caller_for_user("alice").unwrap().uid).await
}

fn grant(id: u32, perm: &str) -> String {
    format!("<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"CanonicalUser\"><ID>{id}</ID></Grantee><Permission>{perm}</Permission></Grant>")
}

fn policy(owner: u32, grants: &[String]) -> Vec<u8> {
    format!("<AccessControlPolicy><Owner><ID>{owner}</ID></Owner><AccessControlList>{}</AccessControlList></AccessControlPolicy>", grants.concat()).into_bytes()
}

impl User {
    async fn req(&self, s: &Server, method: &str, path: &str, query: &[(&str, &str)], body: Vec<u8>) -> (u16, String) {
        let res = s.signed_with(method, path, query, body, &self.access, &self.secret).send().await.unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_read_grants_admit_and_revoking_refuses() {
    let s = start().await;
    let alice = alice_uid(&s).await;
    let bob = bob(&s).await;
    assert_eq!(s.call("PUT", "/grants", &[], vec![]).await.0, 200);
    let res = s.signed("PUT", "/grants/o", &[], b"data".to_vec()).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(bob.req(&s, "GET", "/grants/o", &[], vec![]).await.0, 403, "private: mode 0600");

    let (code, body) = s.call("PUT", "/grants/o", &[("acl", "")], policy(alice, &[grant(alice, "FULL_CONTROL"), grant(bob.uid, "READ")])).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = bob.req(&s, "GET", "/grants/o", &[], vec![]).await;
    assert_eq!((code, body.as_str()), (200, "data"));
    assert_eq!(bob.req(&s, "HEAD", "/grants/o", &[], vec![]).await.0, 200);
    let (code, acl) = s.call("GET", "/grants/o", &[("acl", "")], vec![]).await;
    assert_eq!(code, 200);
    assert!(acl.contains(&format!("<DisplayName>bob</DisplayName><ID>{}</ID>", bob.uid)), "{acl}");
    let first = acl.find("FULL_CONTROL").unwrap();
    let second = acl.find("<Permission>READ</Permission>").unwrap();
    assert!(first < second, "grants come back in the order they were put: {acl}");
    // READ is not READ_ACP, nor a right to write.
    assert_eq!(bob.req(&s, "GET", "/grants/o", &[("acl", "")], vec![]).await.0, 403);
    assert_eq!(bob.req(&s, "PUT", "/grants/o", &[("acl", "")], policy(alice, &[grant(bob.uid, "FULL_CONTROL")])).await.0, 403);
    assert_eq!(bob.req(&s, "PUT", "/grants/o", &[], b"overwrite".to_vec()).await.0, 403);
    assert_eq!(bob.req(&s, "DELETE", "/grants/o", &[], vec![]).await.0, 403);
    assert_eq!(bob.req(&s, "GET", "/grants", &[("list-type", "2")], vec![]).await.0, 403, "a grant on an object is no right to list its bucket");

    // A policy Deny wins over the grant.
    let deny = format!(
        r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Deny","Principal":{{"AWS":"arn:aws:iam::{}:root"}},"Action":"s3:GetObject","Resource":"arn:aws:s3:::grants/o"}}]}}"#,
        bob.uid
    );
    assert_eq!(s.call("PUT", "/grants", &[("policy", "")], deny.into_bytes()).await.0, 204);
    assert_eq!(bob.req(&s, "GET", "/grants/o", &[], vec![]).await.0, 403);
    assert_eq!(s.call("DELETE", "/grants", &[("policy", "")], vec![]).await.0, 204);
    assert_eq!(bob.req(&s, "GET", "/grants/o", &[], vec![]).await.0, 200);

    // READ_ACP lets bob read the ACL; taking the grants away refuses him again.
    let (code, _) = s.call("PUT", "/grants/o", &[("acl", "")], policy(alice, &[grant(alice, "FULL_CONTROL"), grant(bob.uid, "READ"), grant(bob.uid, "READ_ACP")])).await;
    assert_eq!(code, 200);
    let (code, acl) = bob.req(&s, "GET", "/grants/o", &[("acl", "")], vec![]).await;
    assert_eq!(code, 200, "{acl}");
    assert!(acl.contains("READ_ACP"), "{acl}");
    let (code, _) = s.call("PUT", "/grants/o", &[("acl", "")], policy(alice, &[grant(alice, "FULL_CONTROL")])).await;
    assert_eq!(code, 200);
    assert_eq!(bob.req(&s, "GET", "/grants/o", &[], vec![]).await.0, 403);
    assert_eq!(bob.req(&s, "GET", "/grants/o", &[("acl", "")], vec![]).await.0, 403);
    let (_, acl) = s.call("GET", "/grants/o", &[("acl", "")], vec![]).await;
    assert!(!acl.contains("bob"), "{acl}");
    let mode = s.with_engine(|e| e.resolve(&Caller::system(), "/grants/o").unwrap().mode & 0o777).await;
    assert_eq!(mode, 0o600, "owner full control alone is the mode view again");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_write_grants_let_others_upload_as_the_bucket_owner() {
    let s = start().await;
    let alice = alice_uid(&s).await;
    let bob = bob(&s).await;
    assert_eq!(s.call("PUT", "/writes", &[], vec![]).await.0, 200);
    assert_eq!(bob.req(&s, "PUT", "/writes/new", &[], b"x".to_vec()).await.0, 403, "bob may not write into alice's directory");
    let res = s
        .signed("PUT", "/writes", &[("acl", "")], vec![])
        .header("x-amz-grant-write", format!("id=\"{}\"", bob.uid))
        .header("x-amz-grant-full-control", format!("id={alice}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200, "{}", res.text().await.unwrap());
    let (code, body) = bob.req(&s, "PUT", "/writes/new", &[], b"from bob".to_vec()).await;
    assert_eq!(code, 200, "{body}");
    let uid = s.with_engine(|e| e.resolve(&Caller::system(), "/writes/new").unwrap().uid).await;
    assert_eq!(uid, alice, "written with the bucket owner's permissions");
    // In S3's terms bob owns what he uploaded: he reads it and its ACL; alice, who granted
    // herself nothing on it, may not read it (she may still delete it: bucket WRITE).
    let (code, body) = bob.req(&s, "GET", "/writes/new", &[], vec![]).await;
    assert_eq!((code, body.as_str()), (200, "from bob"));
    let (code, acl) = bob.req(&s, "GET", "/writes/new", &[("acl", "")], vec![]).await;
    assert_eq!(code, 200, "{acl}");
    assert!(acl.contains(&format!("<Owner><DisplayName>bob</DisplayName><ID>{}</ID></Owner>", bob.uid)), "{acl}");
    assert_eq!(s.call("GET", "/writes/new", &[], vec![]).await.0, 403);
    // WRITE is not READ: bob may not list.
    assert_eq!(bob.req(&s, "GET", "/writes", &[("list-type", "2")], vec![]).await.0, 403);
    assert_eq!(bob.req(&s, "GET", "/writes", &[("acl", "")], vec![]).await.0, 403);
    let (code, acl) = s.call("GET", "/writes", &[("acl", "")], vec![]).await;
    assert_eq!(code, 200);
    assert!(acl.contains("<Permission>WRITE</Permission>") && acl.contains("<DisplayName>bob</DisplayName>"), "{acl}");
    assert_eq!(bob.req(&s, "DELETE", "/writes/new", &[], vec![]).await.0, 204);
    assert_eq!(s.call("PUT", "/writes/mine", &[], b"a".to_vec()).await.0, 200, "alice holds FULL_CONTROL");

    // An ACL without grants to the owner refuses the owner's writes, but never her ACL.
    let (code, body) = s.call("PUT", "/writes", &[("acl", "")], policy(alice, &[])).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = s.call("PUT", "/writes/again", &[], b"a".to_vec()).await;
    assert_eq!((code, error_code(&body)), (403, "AccessDenied"));
    let (code, acl) = s.call("GET", "/writes", &[("acl", "")], vec![]).await;
    assert_eq!(code, 200);
    assert!(!acl.contains("<Grant>"), "{acl}");
    let res = s.signed("PUT", "/writes", &[("acl", "")], vec![]).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.call("PUT", "/writes/again", &[], b"a".to_vec()).await.0, 200);
    assert_eq!(bob.req(&s, "PUT", "/writes/bob2", &[], b"x".to_vec()).await.0, 403, "the grant is gone");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acls_change_nothing() {
    let s = start().await;
    let alice = alice_uid(&s).await;
    assert_eq!(s.call("PUT", "/refused", &[], vec![]).await.0, 200);
    let (_, before) = s.call("GET", "/refused", &[("acl", "")], vec![]).await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (policy(alice, &[grant(alice, "FULL_CONTROL"), grant(999_999, "READ")]), "InvalidArgument"),
        (policy(alice, &["<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"CanonicalUser\"><ID>_foo</ID></Grantee><Permission>READ</Permission></Grant>".into()]), "InvalidArgument"),
        (
            policy(alice, &["<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"AmazonCustomerByEmail\"><EmailAddress>nobody@example.invalid</EmailAddress></Grantee><Permission>READ</Permission></Grant>".into()]),
            "UnresolvableGrantByEmailAddress",
        ),
        (policy(alice, &[grant(alice, "MAYBE")]), "MalformedACLError"),
        (policy(alice, &["<Grant><Permission>READ</Permission></Grant>".into()]), "MalformedACLError"),
        (
            policy(alice, &["<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"Group\"><URI>http://acs.amazonaws.com/groups/s3/LogDelivery</URI></Grantee><Permission>WRITE</Permission></Grant>".into()]),
            "InvalidArgument",
        ),
        (policy(alice + 1, &[grant(alice, "FULL_CONTROL")]), "InvalidArgument"),
    ];
    for (body, code) in cases {
        let (status, answer) = s.call("PUT", "/refused", &[("acl", "")], body).await;
        assert_eq!((status, error_code(&answer)), (400, code), "{answer}");
        let (_, now) = s.call("GET", "/refused", &[("acl", "")], vec![]).await;
        assert_eq!(now, before, "a refused ACL leaves the bucket's");
    }
    let res = s.signed("PUT", "/refused", &[("acl", "")], vec![]).header("x-amz-grant-read", "id=999999").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 400);
    let res = s.signed("PUT", "/refused", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").header("x-amz-grant-read", format!("id={alice}")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 400, "a canned ACL and grant headers together");
    let (_, now) = s.call("GET", "/refused", &[("acl", "")], vec![]).await;
    assert_eq!(now, before);
    // CreateBucket with a refused grant creates no bucket.
    let res = s.signed("PUT", "/refused2", &[], vec![]).header("x-amz-grant-read", "id=999999").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 400);
    assert_eq!(s.call("HEAD", "/refused2", &[], vec![]).await.0, 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_read_admits_signed_users_only_and_public_read_write_admits_anyone() {
    let s = start().await;
    let bob = bob(&s).await;
    let anon = |path: &str| s.http.get(format!("{}{path}", s.endpoint())).send();
    let res = s.signed("PUT", "/authread", &[], vec![]).header("x-amz-acl", "authenticated-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let res = s.signed("PUT", "/authread/o", &[], b"for users".to_vec()).header("x-amz-acl", "authenticated-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let (code, body) = bob.req(&s, "GET", "/authread/o", &[], vec![]).await;
    assert_eq!((code, body.as_str()), (200, "for users"));
    assert_eq!(bob.req(&s, "GET", "/authread", &[("list-type", "2")], vec![]).await.0, 200);
    assert_eq!(anon("/authread/o").await.unwrap().status().as_u16(), 403);
    assert_eq!(anon("/authread?list-type=2").await.unwrap().status().as_u16(), 403);
    let (_, acl) = s.call("GET", "/authread/o", &[("acl", "")], vec![]).await;
    assert!(acl.contains(AUTHENTICATED) && acl.contains("FULL_CONTROL"), "{acl}");
    let (_, acl) = s.call("GET", "/authread", &[("acl", "")], vec![]).await;
    assert!(acl.find(AUTHENTICATED).unwrap() < acl.find("FULL_CONTROL").unwrap(), "canned: groups first, as RGW lists them: {acl}");
    // An authenticated-read object in a public-read bucket stays closed to anonymous clients.
    let res = s.signed("PUT", "/authread", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(anon("/authread?list-type=2").await.unwrap().status().as_u16(), 200);
    assert_eq!(anon("/authread/o").await.unwrap().status().as_u16(), 403);

    // public-read-write: anonymous clients read and write (as the bucket owner).
    let res = s.signed("PUT", "/pubrw", &[], vec![]).header("x-amz-acl", "public-read-write").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let res = s.http.put(format!("{}/pubrw/anon", s.endpoint())).header("x-amz-acl", "public-read").body("anonymous").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(anon("/pubrw/anon").await.unwrap().text().await.unwrap(), "anonymous");
    // Without an ACL of its own, an object is private whatever its bucket's ACL (as S3).
    let res = s.http.put(format!("{}/pubrw/closed", s.endpoint())).body("closed").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(anon("/pubrw/closed").await.unwrap().status().as_u16(), 403);
    assert_eq!(s.call("GET", "/pubrw/closed", &[], vec![]).await, (200, "closed".to_string()));
    assert_eq!(anon("/pubrw?list-type=2").await.unwrap().status().as_u16(), 200);
    assert_eq!(s.http.delete(format!("{}/pubrw/anon", s.endpoint())).send().await.unwrap().status().as_u16(), 204);
    let (_, acl) = s.call("GET", "/pubrw", &[("acl", "")], vec![]).await;
    assert!(acl.contains("<Permission>WRITE</Permission>"), "{acl}");
    // Back to private: anonymous writes are refused again.
    let res = s.signed("PUT", "/pubrw", &[("acl", "")], vec![]).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.http.put(format!("{}/pubrw/anon2", s.endpoint())).body("x").send().await.unwrap().status().as_u16(), 403);
    s.stop().await;
}

/// Without a grant or a policy, a bucket and its objects are private to their owner over S3,
/// whatever the file modes let other users do over NFS or SMB; a user still reaches what it
/// owns in another user's bucket, and public-read buckets stay readable to everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_private_to_their_owner_without_grants() {
    let s = start().await;
    let bob = bob(&s).await;
    assert_eq!(s.call("PUT", "/mine", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/mine/data/o", &[], b"alice's".to_vec()).await.0, 200);
    // The modes let others read (0755 directories, 0644 files) ...
    let bob_uid = bob.uid;
    let (mode, through_engine) = s
        .with_engine(move |e| {
            let bob = e.caller_for_uid(bob_uid, bob_uid, &[]).unwrap();
            let a = e.resolve(&bob, "/mine/data/o").unwrap();
            (a.mode & 0o777, e.read(&bob, a.ino, 0, 64).unwrap())
        })
        .await;
    assert_eq!((mode, through_engine.as_slice()), (0o644, &b"alice's"[..]), "file access follows the mode");
    // ... but over S3 bob gets nothing of alice's bucket, and nothing changes.
    for (method, path, query, body) in [
        ("GET", "/mine/data/o", &[][..], vec![]),
        ("HEAD", "/mine/data/o", &[][..], vec![]),
        ("GET", "/mine", &[("list-type", "2")][..], vec![]),
        ("GET", "/mine", &[][..], vec![]),
        ("HEAD", "/mine", &[][..], vec![]),
        ("PUT", "/mine/data/o", &[][..], b"bob's".to_vec()),
        ("PUT", "/mine/new", &[][..], b"bob's".to_vec()),
        ("DELETE", "/mine/data/o", &[][..], vec![]),
        ("GET", "/mine/data/o", &[("tagging", "")][..], vec![]),
    ] {
        let (code, body) = bob.req(&s, method, path, query, body).await;
        assert_eq!(code, 403, "{method} {path} {query:?}: {body}");
    }
    let delete = b"<Delete><Object><Key>data/o</Key></Object></Delete>".to_vec();
    let res = s
        .signed_with("POST", "/mine", &[("delete", "")], delete, &bob.access, &bob.secret)
        .header("content-md5", "PJ2q6xwMTgiZabMt7djckw==")
        .send()
        .await
        .unwrap();
    let body = res.text().await.unwrap();
    assert!(body.contains("<Code>AccessDenied</Code>") && !body.contains("<Deleted>"), "{body}");
    let copy = s.signed_with("PUT", "/mine/copy", &[], vec![], &bob.access, &bob.secret).header("x-amz-copy-source", "/mine/data/o").send().await.unwrap();
    assert_eq!(copy.status().as_u16(), 403);
    let (code, body) = s.call("GET", "/mine/data/o", &[], vec![]).await;
    assert_eq!((code, body.as_str()), (200, "alice's"));
    let (code, list) = s.call("GET", "/mine", &[("list-type", "2")], vec![]).await;
    assert!(code == 200 && list.contains("<KeyCount>1</KeyCount>"), "{list}");

    // Bob's own file in alice's bucket (made over NFS, say) is his to read over S3.
    s.with_engine(move |e| {
        let bob = e.caller_for_uid(bob_uid, bob_uid, &[]).unwrap();
        let admin = Caller::system();
        let d = e.resolve(&admin, "/mine/data").unwrap();
        e.setattr(&admin, d.ino, storage_engine::SetAttr { mode: Some(0o777), ..Default::default() }).unwrap();
        let f = e.create(&bob, d.ino, b"bobs", 0o644, true).unwrap();
        e.write(&bob, f.ino, 0, b"bob's file", storage_engine::Stability::Durable).unwrap();
    })
    .await;
    let (code, body) = bob.req(&s, "GET", "/mine/data/bobs", &[], vec![]).await;
    assert_eq!((code, body.as_str()), (200, "bob's file"));

    // ListBuckets names one's own buckets only, as S3.
    let (code, list) = bob.req(&s, "GET", "/", &[], vec![]).await;
    assert_eq!(code, 200, "{list}");
    assert!(list.contains("<ListAllMyBucketsResult") && !list.contains("<Name>mine</Name>"), "{list}");
    let (code, list) = s.call("GET", "/", &[], vec![]).await;
    assert!(code == 200 && list.contains("<Name>mine</Name>"), "{list}");

    // A copy takes the ACL its request gives: public-read makes it readable to bob.
    let res = s.signed("PUT", "/mine/pubcopy", &[], vec![]).header("x-amz-copy-source", "/mine/data/o").header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let (code, body) = bob.req(&s, "GET", "/mine/pubcopy", &[], vec![]).await;
    assert_eq!((code, body.as_str()), (200, "alice's"));
    assert_eq!(bob.req(&s, "GET", "/mine/data/o", &[], vec![]).await.0, 403, "the source keeps its own ACL");

    // A public-read bucket's listing is open to every signed-in user too; its objects are
    // not, unless they are public-read themselves (as S3).
    assert_eq!(s.call("PUT", "/mine", &[("acl", "")], vec![]).await.0, 400, "an ACL needs a body or a header");
    let res = s.signed("PUT", "/mine", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(bob.req(&s, "GET", "/mine", &[("list-type", "2")], vec![]).await.0, 200);
    assert_eq!(bob.req(&s, "GET", "/mine/data/o", &[], vec![]).await.0, 403, "an object without an ACL stays private");
    let (code, body) = bob.req(&s, "GET", "/mine/pubcopy", &[], vec![]).await;
    assert_eq!((code, body.as_str()), (200, "alice's"));
    assert_eq!(bob.req(&s, "PUT", "/mine/new", &[], b"bob's".to_vec()).await.0, 403, "public-read is no right to write");
    s.stop().await;
}
