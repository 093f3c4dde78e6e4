//! Lifecycle configuration over the wire: stored with the bucket, refused as S3 refuses it
//! (nothing stored), and carried out by a lifecycle pass run for a chosen "now".

mod common;

use common::{Server, error_code, start, start_with};
use storage_engine::{Caller, NewUser};

fn lc(rules: &str) -> Vec<u8> {
    format!("<LifecycleConfiguration>{rules}</LifecycleConfiguration>").into_bytes()
}

const EXPIRE_OLD: &str = "<Rule><ID>old</ID><Filter><Prefix>old/</Prefix></Filter><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configurations_round_trip_and_invalid_ones_change_nothing() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/life", &[], vec![]).await.0, 200);
    let (code, body) = s.call("GET", "/life", &[("lifecycle", "")], vec![]).await;
    assert_eq!((code, error_code(&body)), (404, "NoSuchLifecycleConfiguration"), "{body}");

    let good = lc(&format!(
        "{EXPIRE_OLD}<Rule><Prefix>tmp/</Prefix><Status>Disabled</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>2</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule>"
    ));
    let (code, body) = s.call("PUT", "/life", &[("lifecycle", "")], good).await;
    assert_eq!(code, 200, "{body}");
    let (code, stored) = s.call("GET", "/life", &[("lifecycle", "")], vec![]).await;
    assert_eq!(code, 200);
    for part in ["<ID>old</ID>", "<Prefix>old/</Prefix>", "<Days>1</Days>", "<Status>Disabled</Status>", "<Prefix>tmp/</Prefix>", "<DaysAfterInitiation>2</DaysAfterInitiation>"] {
        assert!(stored.contains(part), "{part} in {stored}");
    }
    assert_eq!(stored.matches("<ID>").count(), 2, "a rule without an ID gets one: {stored}");

    let long_id = "a".repeat(256);
    for (bad, want) in [
        (lc(&format!("<Rule><ID>{long_id}</ID><Prefix>x/</Prefix><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule>")), "InvalidArgument"),
        (lc(&format!("{EXPIRE_OLD}{EXPIRE_OLD}")), "InvalidArgument"),
        (lc("<Rule><ID>r</ID><Prefix>x/</Prefix><Status>enabled</Status><Expiration><Days>1</Days></Expiration></Rule>"), "MalformedXML"),
        (lc("<Rule><ID>r</ID><Prefix>x/</Prefix><Status>Enabled</Status><Expiration><Days>0</Days></Expiration></Rule>"), "InvalidArgument"),
        (lc("<Rule><ID>r</ID><Prefix>x/</Prefix><Status>Enabled</Status><Expiration><Days>-3</Days></Expiration></Rule>"), "InvalidArgument"),
        (lc("<Rule><ID>r</ID><Prefix>x/</Prefix><Status>Enabled</Status><Expiration><Date>2030-01-01T12:00:00Z</Date></Expiration></Rule>"), "InvalidArgument"),
        (lc("<Rule><ID>r</ID><Prefix>x/</Prefix><Status>Enabled</Status><Expiration><Date>20300101</Date></Expiration></Rule>"), "MalformedXML"),
        (lc("<Rule><ID>r</ID><Prefix>x/</Prefix><Status>Enabled</Status></Rule>"), "InvalidArgument"),
        (lc("<Rule><ID>r</ID><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule>"), "MalformedXML"),
        (lc("<Rule><ID>r</ID><Prefix>x/</Prefix><Status>Enabled</Status><Transition><Days>1</Days><StorageClass>GLACIER</StorageClass></Transition></Rule>"), "InvalidStorageClass"),
        (lc(""), "MalformedXML"),
        (b"<LifecycleConfiguration><Rule>".to_vec(), "MalformedXML"),
    ] {
        let (code, body) = s.call("PUT", "/life", &[("lifecycle", "")], bad).await;
        assert_eq!((code, error_code(&body)), (400, want), "{body}");
        let (_, now) = s.call("GET", "/life", &[("lifecycle", "")], vec![]).await;
        assert_eq!(now, stored, "a refused configuration leaves the stored one");
    }

    // Only the owner manages it.
    let (bob_access, bob_secret) = s
        .with_engine(|e| {
            e.create_user(&Caller::system(), NewUser { name: "bob".into(), password: "bob-password".into(), uid: None, gid: None, groups: vec![], role: None }).unwrap();
            e.create_s3_key(&Caller::system(), "bob", None).unwrap()
        })
        .await;
    let res = s.signed_with("GET", "/life", &[("lifecycle", "")], vec![], &bob_access, &bob_secret).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    let res = s.signed_with("DELETE", "/life", &[("lifecycle", "")], vec![], &bob_access, &bob_secret).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);

    assert_eq!(s.call("DELETE", "/life", &[("lifecycle", "")], vec![]).await.0, 204);
    assert_eq!(s.call("GET", "/life", &[("lifecycle", "")], vec![]).await.0, 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_deletes_due_objects_that_match_the_filter() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/exp", &[], vec![]).await.0, 200);
    for key in ["old/a", "old/deep/b", "keep/c", "tagged/d", "tagged/e"] {
        assert_eq!(s.call("PUT", &format!("/exp/{key}"), &[], b"x".to_vec()).await.0, 200);
    }
    let res = s.signed("PUT", "/exp/tagged/d", &[("tagging", "")], b"<Tagging><TagSet><Tag><Key>t</Key><Value>gone</Value></Tag></TagSet></Tagging>".to_vec()).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let upload = s.call("POST", "/exp/old/upload", &[("uploads", "")], vec![]).await.1;
    assert!(upload.contains("<UploadId>"), "{upload}");
    let rules = lc(&format!(
        "{EXPIRE_OLD}<Rule><ID>tags</ID><Filter><And><Prefix>tagged/</Prefix><Tag><Key>t</Key><Value>gone</Value></Tag></And></Filter><Status>Enabled</Status><Expiration><Days>2</Days></Expiration></Rule>\
         <Rule><ID>mpu</ID><Filter><Prefix>old/</Prefix></Filter><Status>Enabled</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>1</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule>\
         <Rule><ID>off</ID><Filter><Prefix>keep/</Prefix></Filter><Status>Disabled</Status><Expiration><Days>1</Days></Expiration></Rule>"
    ));
    let (code, body) = s.call("PUT", "/exp", &[("lifecycle", "")], rules).await;
    assert_eq!(code, 200, "{body}");

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let day = 86_400;
    let pass = |at: i64| s.with_engine(move |e| aquifer_s3::lifecycle_pass(e, at));
    let sr = &s;
    let exists = |key: &'static str| async move { sr.call("HEAD", &format!("/exp/{key}"), &[], vec![]).await.0 == 200 };

    assert_eq!(pass(now).await, 0, "nothing is due yet");
    // Two days on: one day's rule is due (counted to the next midnight UTC), the two days'
    // rule not before its midnight.
    let n = pass(now + 2 * day).await;
    assert_eq!(n, 3, "old/a, old/deep/b and the upload under old/");
    assert!(!exists("old/a").await && !exists("old/deep/b").await);
    assert!(exists("keep/c").await && exists("tagged/d").await && exists("tagged/e").await);
    let uploads = s.call("GET", "/exp", &[("uploads", "")], vec![]).await.1;
    assert!(!uploads.contains("<UploadId>"), "{uploads}");

    assert_eq!(pass(now + 3 * day).await, 1);
    assert!(!exists("tagged/d").await, "the tagged object expired");
    assert!(exists("tagged/e").await, "its untagged neighbour did not");
    assert!(exists("keep/c").await, "a disabled rule does nothing");

    // Without a configuration, nothing happens whatever the time.
    assert_eq!(s.call("DELETE", "/exp", &[("lifecycle", "")], vec![]).await.0, 204);
    assert_eq!(pass(now + 1000 * day).await, 0);
    assert!(exists("keep/c").await && exists("tagged/e").await);
    s.stop().await;
}

/// GETs `path` until it answers 404 or `secs` pass; returns the last status.
async fn gone_within(s: &Server, path: &str, secs: u64) -> u16 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let code = s.call("GET", path, &[], vec![]).await.0;
        if code == 404 || std::time::Instant::now() > deadline {
            return code;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The listener's own task carries a new configuration out within seconds (not at its next
/// hourly pass): an Expiration Date already past deletes at once, while `Days` wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_configuration_is_carried_out_within_seconds() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/soon", &[], vec![]).await.0, 200);
    for key in ["past/a", "days/b"] {
        assert_eq!(s.call("PUT", &format!("/soon/{key}"), &[], b"x".to_vec()).await.0, 200);
    }
    let rules = lc("<Rule><ID>past</ID><Filter><Prefix>past/</Prefix></Filter><Status>Enabled</Status><Expiration><Date>2015-01-01T00:00:00Z</Date></Expiration></Rule>\
        <Rule><ID>days</ID><Filter><Prefix>days/</Prefix></Filter><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule>");
    let (code, body) = s.call("PUT", "/soon", &[("lifecycle", "")], rules).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(gone_within(&s, "/soon/past/a", 20).await, 404, "a past Date expires the object soon after the rule is put");
    assert_eq!(s.call("GET", "/soon/days/b", &[], vec![]).await, (200, "x".to_string()), "one real day has not passed");
    s.stop().await;
}

/// With a shorter lifecycle day (`--s3-lifecycle-day-secs`), `Days` count in its units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_lifecycle_day_expires_in_its_units() {
    let s = start_with(aquifer_s3::S3Options { lifecycle_day_secs: Some(2), ..Default::default() }).await;
    assert_eq!(s.call("PUT", "/short", &[], vec![]).await.0, 200);
    for key in ["one/a", "many/b"] {
        assert_eq!(s.call("PUT", &format!("/short/{key}"), &[], b"x".to_vec()).await.0, 200);
    }
    let rules = lc("<Rule><ID>one</ID><Filter><Prefix>one/</Prefix></Filter><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule>\
        <Rule><ID>many</ID><Filter><Prefix>many/</Prefix></Filter><Status>Enabled</Status><Expiration><Days>1000</Days></Expiration></Rule>");
    let (code, body) = s.call("PUT", "/short", &[("lifecycle", "")], rules).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(gone_within(&s, "/short/one/a", 30).await, 404, "one 2-second day, rounded up to the next, has passed");
    assert_eq!(s.call("GET", "/short/many/b", &[], vec![]).await, (200, "x".to_string()), "1000 short days have not");
    s.stop().await;
}
