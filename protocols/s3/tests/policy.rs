//! Bucket policies over the wire: stored with the bucket, checked when put (nothing stored
//! when malformed), and evaluated for every request: an explicit Deny wins even over the
//! owner, an Allow lets others (anonymous clients included) act with the owner's
//! permissions, and a policy that says nothing leaves the caller's own permissions.

mod common;

use common::{Server, error_code, start};
use storage_engine::{Caller, NewUser};

fn doc(statements: &str) -> Vec<u8> {
    format!(r#"{{"Version":"2012-10-17","Statement":[{statements}]}}"#).into_bytes()
}

async fn put_policy(s: &Server, bucket: &str, body: Vec<u8>) -> (u16, String) {
    s.call("PUT", &format!("/{bucket}"), &[("policy", "")], body).await
}

async fn bob(s: &Server) -> (u32, String, String) {
    s.with_engine(|e| {
        let admin = Caller::system();
        e.create_user(&admin, NewUser { name: "bob".into(), password: "bob-password".into(), uid: None, gid: None, groups: vec![], role: None }).unwrap();
        let (a, k) = e.create_s3_key(&admin, "bob", None).unwrap();
        (e.caller_for_user("bob").unwrap().uid, a, k)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_round_trip_and_malformed_ones_change_nothing() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/pol", &[], vec![]).await.0, 200);
    let (code, body) = s.call("GET", "/pol", &[("policy", "")], vec![]).await;
    assert_eq!((code, error_code(&body)), (404, "NoSuchBucketPolicy"), "{body}");

    let good = doc(r#"{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::pol/*"}"#);
    assert_eq!(put_policy(&s, "pol", good.clone()).await.0, 204);
    let (code, body) = s.call("GET", "/pol", &[("policy", "")], vec![]).await;
    assert_eq!(code, 200);
    assert_eq!(body.as_bytes(), &good[..], "the policy comes back as it was put");

    for bad in [
        b"{not json".to_vec(),
        doc(r#"{"Effect":"Perhaps","Principal":"*","Action":"s3:GetObject","Resource":"*"}"#),
        br#"{"Version":"1999-01-01","Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*"}]}"#.to_vec(),
        doc(r#"{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*","Condition":{"StringMaybe":{"s3:prefix":"x"}}}"#),
    ] {
        let (code, body) = put_policy(&s, "pol", bad).await;
        assert_eq!((code, error_code(&body)), (400, "MalformedPolicy"), "{body}");
        let (_, now) = s.call("GET", "/pol", &[("policy", "")], vec![]).await;
        assert_eq!(now.as_bytes(), &good[..], "a refused policy leaves the stored one");
    }

    // Only the owner manages the policy.
    let (_, bob_access, bob_secret) = bob(&s).await;
    let res = s.signed_with("DELETE", "/pol", &[("policy", "")], vec![], &bob_access, &bob_secret).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);

    assert_eq!(s.call("DELETE", "/pol", &[("policy", "")], vec![]).await.0, 204);
    assert_eq!(s.call("GET", "/pol", &[("policy", "")], vec![]).await.0, 404);
    let (code, body) = put_policy(&s, "nobucket", good).await;
    assert_eq!((code, error_code(&body)), (404, "NoSuchBucket"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_reads_need_a_policy_on_a_private_bucket() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/priv", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/priv/pub/a", &[], b"open".to_vec()).await.0, 200);
    assert_eq!(s.call("PUT", "/priv/secret/b", &[], b"closed".to_vec()).await.0, 200);
    let get = |path: &str| s.http.get(format!("{}{path}", s.endpoint())).send();
    assert_eq!(get("/priv/pub/a").await.unwrap().status().as_u16(), 403, "private without a policy");

    let p = doc(r#"{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::priv/pub/*"}"#);
    assert_eq!(put_policy(&s, "priv", p).await.0, 204);
    let res = get("/priv/pub/a").await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.text().await.unwrap(), "open");
    assert_eq!(get("/priv/secret/b").await.unwrap().status().as_u16(), 403, "outside the resource");
    assert_eq!(get("/priv?list-type=2").await.unwrap().status().as_u16(), 403, "not the action");
    assert_eq!(s.http.put(format!("{}/priv/pub/c", s.endpoint())).body("x").send().await.unwrap().status().as_u16(), 403);

    // Conditions: the peer address (127.0.0.1 here) and a Referer.
    let p = doc(r#"{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::priv/*","Condition":{"IpAddress":{"aws:SourceIp":"10.0.0.0/8"}}}"#);
    assert_eq!(put_policy(&s, "priv", p).await.0, 204);
    assert_eq!(get("/priv/pub/a").await.unwrap().status().as_u16(), 403);
    let p = doc(r#"{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::priv/*","Condition":{"IpAddress":{"aws:SourceIp":"127.0.0.0/8"},"StringLikeIfExists":{"aws:Referer":"http://example.com/*"}}}"#);
    assert_eq!(put_policy(&s, "priv", p).await.0, 204);
    assert_eq!(get("/priv/secret/b").await.unwrap().status().as_u16(), 200);
    let url = format!("{}/priv/secret/b", s.endpoint());
    assert_eq!(s.http.get(&url).header("referer", "http://example.com/x").send().await.unwrap().status().as_u16(), 200);
    assert_eq!(s.http.get(&url).header("referer", "http://evil.example/").send().await.unwrap().status().as_u16(), 403);

    assert_eq!(s.call("DELETE", "/priv", &[("policy", "")], vec![]).await.0, 204);
    assert_eq!(get("/priv/pub/a").await.unwrap().status().as_u16(), 403, "private again");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_overrides_the_owner_and_allow_delegates_to_others() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/ddd", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/ddd/keep/x", &[], b"x".to_vec()).await.0, 200);
    let p = doc(
        r#"{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":["arn:aws:s3:::ddd","arn:aws:s3:::ddd/*"]},
           {"Effect":"Deny","Principal":"*","Action":["s3:GetObject","s3:DeleteObject"],"Resource":"arn:aws:s3:::ddd/keep/*"}"#,
    );
    assert_eq!(put_policy(&s, "ddd", p).await.0, 204);
    let (code, body) = s.call("GET", "/ddd/keep/x", &[], vec![]).await;
    assert_eq!((code, error_code(&body)), (403, "AccessDenied"), "the owner's own Allow loses to the Deny");
    assert_eq!(s.call("DELETE", "/ddd/keep/x", &[], vec![]).await.0, 403);
    // DeleteObjects is decided key by key.
    let del = b"<Delete><Object><Key>keep/x</Key></Object><Object><Key>other</Key></Object></Delete>".to_vec();
    let (code, body) = s.call("POST", "/ddd", &[("delete", "")], del).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("<Error><Code>AccessDenied</Code><Key>keep/x</Key>"), "{body}");
    assert!(body.contains("<Deleted><Key>other</Key>"), "{body}");
    assert_eq!(s.call("HEAD", "/ddd/keep/x", &[], vec![]).await.0, 403);

    // Another user writes into the owner's bucket only through the policy, as the owner.
    let (bob_uid, bob_access, bob_secret) = bob(&s).await;
    let put = |key: &str| s.signed_with("PUT", &format!("/ddd/{key}"), &[], b"from bob".to_vec(), &bob_access, &bob_secret).send();
    assert_eq!(put("bob1").await.unwrap().status().as_u16(), 200);
    let alice_uid = s.with_engine(|e| e.caller_for_user("alice").unwrap().uid).await;
    let owner = s.with_engine(|e| e.resolve(&Caller::system(), "/ddd/bob1").unwrap().uid).await;
    assert_eq!(owner, alice_uid, "a delegated write acts as the bucket owner");
    assert_ne!(owner, bob_uid);
    // In S3's terms bob is its owner: he reads it back, though the policy grants no reads
    // and the bucket is alice's; what alice wrote stays hers.
    let get = |key: &str| s.signed_with("GET", &format!("/ddd/{key}"), &[], vec![], &bob_access, &bob_secret).send();
    let res = get("bob1").await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.text().await.unwrap(), "from bob");
    let (code, acl) = s.call("GET", "/ddd/bob1", &[("acl", "")], vec![]).await;
    assert!(code == 200 && acl.contains(&format!("<Owner><DisplayName>bob</DisplayName><ID>{bob_uid}</ID></Owner>")), "{acl}");
    // A policy that names someone else gives bob nothing; his own permissions refuse him.
    let p = doc(r#"{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam::4242:root"},"Action":"s3:PutObject","Resource":"arn:aws:s3:::ddd/*"}"#);
    assert_eq!(put_policy(&s, "ddd", p).await.0, 204);
    assert_eq!(put("bob2").await.unwrap().status().as_u16(), 403);
    assert_eq!(s.call("PUT", "/ddd/alices", &[], b"alice's".to_vec()).await.0, 200);
    assert_eq!(get("alices").await.unwrap().status().as_u16(), 403, "no grant, no policy for bob: private");
    assert_eq!(get("bob1").await.unwrap().status().as_u16(), 200, "still his");
    let p = doc(&format!(r#"{{"Effect":"Allow","Principal":{{"AWS":"arn:aws:iam::{bob_uid}:root"}},"Action":"s3:PutObject","Resource":"arn:aws:s3:::ddd/*","Condition":{{"StringEquals":{{"s3:x-amz-acl":"private"}}}}}}"#));
    assert_eq!(put_policy(&s, "ddd", p).await.0, 204);
    assert_eq!(put("bob3").await.unwrap().status().as_u16(), 403, "condition not met");
    let res = s.signed_with("PUT", "/ddd/bob3", &[], b"x".to_vec(), &bob_access, &bob_secret).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);

    // The owner cannot lock themselves out of the policy itself.
    let p = doc(r#"{"Effect":"Deny","Principal":"*","Action":"s3:*","Resource":["arn:aws:s3:::ddd","arn:aws:s3:::ddd/*"]}"#);
    assert_eq!(put_policy(&s, "ddd", p).await.0, 204);
    assert_eq!(s.call("GET", "/ddd", &[("list-type", "2")], vec![]).await.0, 403);
    assert_eq!(s.call("DELETE", "/ddd", &[("policy", "")], vec![]).await.0, 204);
    assert_eq!(s.call("GET", "/ddd", &[("list-type", "2")], vec![]).await.0, 200);
    s.stop().await;
}
