//! Fuzzes bucket policies as the S3 listener meets them (protocols/s3/src/policy.rs, compiled
//! here unchanged): a bucket owner's PutBucketPolicy body is parsed and checked, and a policy
//! that is stored is evaluated for every request on the bucket, with values the requester
//! chooses (the resource ARN from the key, condition values from headers and the query).
//!
//!     RUSTC_BOOTSTRAP=1 cargo fuzz run bucket_policy -- -max_total_time=240 -timeout=2
//!
//! Input: the policy document, then after a NUL byte the request: its resource ARN, then one
//! condition value a line.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/policy.rs"]
#[allow(dead_code)]
mod policy;

use policy::{Context, Policy, Principal};

/// Condition keys a request carries (Aquifer fills these from the request).
const KEYS: &[&str] = &[
    "aws:SourceIp",
    "aws:username",
    "aws:userid",
    "aws:CurrentTime",
    "aws:EpochTime",
    "aws:SecureTransport",
    "aws:Referer",
    "aws:UserAgent",
    "s3:prefix",
    "s3:delimiter",
    "s3:max-keys",
    "s3:x-amz-acl",
    "s3:x-amz-copy-source",
    "s3:ExistingObjectTag/project",
    "s3:RequestObjectTag/project",
    "s3:versionid",
];

const ACTIONS: &[&str] = &["s3:GetObject", "s3:PutObject", "s3:ListBucket", "s3:DeleteObject", "s3:GetObjectVersion", "s3:PutObjectAcl"];

fuzz_target!(|data: &[u8]| {
    let (doc, request) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(p) = Policy::parse(doc) else { return };
    let request = String::from_utf8_lossy(request);
    let mut lines = request.split('\n');
    let resource = lines.next().filter(|r| !r.is_empty()).unwrap_or("arn:aws:s3:::bucket/key");
    let mut cx = Context::default();
    for (i, v) in lines.enumerate() {
        cx.add(KEYS[i % KEYS.len()], v);
    }
    let alice = Principal { uid: 1000, user: "alice".into(), access_key: "AKIAALICE".into() };
    for action in ACTIONS {
        let _ = p.evaluate(Some(&alice), action, resource, &cx);
        let _ = p.evaluate(None, action, resource, &cx);
    }
    let _ = p.uses_key_prefix("s3:existingobjecttag/");
});
