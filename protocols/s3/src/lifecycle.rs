//! Bucket lifecycle configuration: checked as S3 checks it when put, stored with the bucket
//! (xattr `aquifer.s3.lifecycle`, the configuration as S3 XML), and carried out by a
//! background task of the S3 listener ([`run`]) that deletes current objects whose
//! `Expiration` is due and aborts multipart uploads older than `AbortIncompleteMultipartUpload`
//! allows.
//!
//! Aquifer has one storage class: transitions are refused (`InvalidStorageClass`, as S3
//! answers for a class that cannot be a target). In versioned buckets `Expiration` makes
//! delete markers, `NoncurrentVersionExpiration` deletes noncurrent versions `NoncurrentDays`
//! after they stopped being current (keeping the `NewerNoncurrentVersions` newest), and
//! `ExpiredObjectDeleteMarker` removes delete markers that are a key's only version.
//!
//! When an object is due: as S3, `Days` counts from the object's last modification and
//! rounds up to the next midnight UTC; `Date` is a midnight UTC. A new or changed
//! configuration is carried out within seconds, then hourly. For trying rules out, the
//! daemon's `--s3-lifecycle-day-secs` makes a lifecycle day shorter (as Ceph RGW's
//! `rgw_lc_debug_interval`): `Days` then count in those units, rounded up to a multiple of
//! one, and passes run ten times a day; tests may also call [`lifecycle_pass`] with the
//! time they want to be now.

use std::sync::Arc;
use std::time::Duration;

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result};
use storage_engine::{Caller, Engine, FileKind, ROOT_INO};

use crate::meta::{XATTR_LIFECYCLE, XATTR_TAGS, decode_tags};

/// Most rules in one configuration (as S3).
pub const LIFECYCLE_RULES_MAX: usize = 1000;
/// Longest rule ID (as S3).
const RULE_ID_BYTES_MAX: usize = 255;
/// How often the background task looks at every bucket (S3 itself runs once a day).
const SCAN_INTERVAL_SECS: u64 = 3600;
/// Objects deleted (and uploads aborted) in one pass at most; the rest wait for the next.
const ACTIONS_PER_PASS_MAX: usize = 100_000;
/// Keys listed per engine call while scanning.
const LIST_PAGE_KEYS: usize = 1000;

const DAY_SECS: i64 = 86_400;

fn malformed(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedXML, msg.into())
}

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, msg.into())
}

fn unix_secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

/// Checks a configuration as S3 does and gives rules without an ID a random one (S3 does
/// too, and clients expect every rule to come back with one). Any error refuses the whole
/// configuration.
pub fn check(cfg: &mut BucketLifecycleConfiguration) -> S3Result<()> {
    if cfg.rules.is_empty() {
        return Err(malformed("a lifecycle configuration needs at least one Rule"));
    }
    if cfg.rules.len() > LIFECYCLE_RULES_MAX {
        return Err(malformed(format!("at most {LIFECYCLE_RULES_MAX} rules")));
    }
    let mut ids = std::collections::HashSet::new();
    for rule in cfg.rules.iter_mut() {
        let id = rule.id.get_or_insert_with(|| format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()));
        if id.len() > RULE_ID_BYTES_MAX {
            return Err(invalid(format!("rule IDs are at most {RULE_ID_BYTES_MAX} bytes")));
        }
        if !ids.insert(id.clone()) {
            return Err(invalid(format!("rule ID {id} is used twice")));
        }
        check_rule(rule)?;
    }
    Ok(())
}

fn check_rule(rule: &LifecycleRule) -> S3Result<()> {
    match rule.status.as_str() {
        ExpirationStatus::ENABLED | ExpirationStatus::DISABLED => {}
        other => return Err(malformed(format!("rule Status {other:?} must be Enabled or Disabled"))),
    }
    match (&rule.prefix, &rule.filter) {
        (Some(_), Some(_)) => return Err(malformed("a rule has either a Prefix or a Filter, not both")),
        (None, None) => return Err(malformed("a rule needs a Filter (or the older Prefix)")),
        (None, Some(f)) => check_filter(f)?,
        (Some(_), None) => {}
    }
    let has_tags = rule.filter.as_ref().is_some_and(|f| f.tag.is_some() || f.and.as_ref().is_some_and(|a| a.tags.as_ref().is_some_and(|t| !t.is_empty())));
    if rule.transitions.as_ref().is_some_and(|t| !t.is_empty()) || rule.noncurrent_version_transitions.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(S3Error::with_message(S3ErrorCode::InvalidStorageClass, "Aquifer has one storage class (STANDARD): transitions have no target"));
    }
    let mut actions = 0;
    if let Some(e) = &rule.expiration {
        actions += 1;
        let marker = e.expired_object_delete_marker.is_some();
        let n = usize::from(e.days.is_some()) + usize::from(e.date.is_some()) + usize::from(marker);
        if n != 1 {
            return Err(malformed("Expiration takes exactly one of Days, Date and ExpiredObjectDeleteMarker"));
        }
        if marker && has_tags {
            return Err(invalid("ExpiredObjectDeleteMarker cannot be used with tag filters"));
        }
        if let Some(d) = e.days
            && d <= 0
        {
            return Err(invalid("Expiration Days must be a positive integer"));
        }
        if let Some(t) = &e.date
            && unix_secs(t).rem_euclid(DAY_SECS) != 0
        {
            return Err(invalid("Expiration Date must be at midnight UTC"));
        }
    }
    if let Some(n) = &rule.noncurrent_version_expiration {
        actions += 1;
        if n.noncurrent_days.is_none_or(|d| d <= 0) {
            return Err(invalid("NoncurrentDays must be a positive integer"));
        }
        if n.newer_noncurrent_versions.is_some_and(|v| v <= 0) {
            return Err(invalid("NewerNoncurrentVersions must be a positive integer"));
        }
    }
    if let Some(a) = &rule.abort_incomplete_multipart_upload {
        actions += 1;
        if a.days_after_initiation.is_none_or(|d| d <= 0) {
            return Err(invalid("DaysAfterInitiation must be a positive integer"));
        }
        if has_tags {
            return Err(invalid("AbortIncompleteMultipartUpload cannot be used with tag filters"));
        }
    }
    if actions == 0 {
        return Err(invalid("a rule needs at least one action"));
    }
    Ok(())
}

fn check_tag(t: &Tag) -> S3Result<()> {
    let k = t.key.as_deref().unwrap_or("");
    if k.is_empty() || k.len() > crate::meta::TAG_KEY_BYTES_MAX || t.value.as_deref().unwrap_or("").len() > crate::meta::TAG_VALUE_BYTES_MAX {
        return Err(S3Error::with_message(S3ErrorCode::InvalidTag, "filter tag keys are 1-128 bytes, values at most 256"));
    }
    Ok(())
}

fn check_filter(f: &LifecycleRuleFilter) -> S3Result<()> {
    let n = usize::from(f.prefix.is_some())
        + usize::from(f.tag.is_some())
        + usize::from(f.and.is_some())
        + usize::from(f.object_size_greater_than.is_some())
        + usize::from(f.object_size_less_than.is_some());
    if n > 1 {
        return Err(malformed("a Filter holds one condition; combine several with And"));
    }
    if let Some(t) = &f.tag {
        check_tag(t)?;
    }
    if let Some(a) = &f.and {
        let mut keys = std::collections::HashSet::new();
        for t in a.tags.iter().flatten() {
            check_tag(t)?;
            if !keys.insert(t.key.clone()) {
                return Err(invalid("a tag key appears twice in a filter"));
            }
        }
    }
    let (gt, lt) = match (&f.and, f.object_size_greater_than, f.object_size_less_than) {
        (Some(a), _, _) => (a.object_size_greater_than, a.object_size_less_than),
        (None, gt, lt) => (gt, lt),
    };
    if gt.is_some_and(|v| v < 0) || lt.is_some_and(|v| v <= 0) || gt.zip(lt).is_some_and(|(g, l)| g >= l) {
        return Err(invalid("ObjectSizeGreaterThan must be at least 0 and less than ObjectSizeLessThan"));
    }
    Ok(())
}

/// The stored form: the configuration as S3 XML.
pub fn encode(cfg: &BucketLifecycleConfiguration) -> Vec<u8> {
    crate::meta::xml_encode("LifecycleConfiguration", cfg)
}

pub fn decode(b: &[u8]) -> Option<BucketLifecycleConfiguration> {
    crate::meta::xml_decode("LifecycleConfiguration", b)
}

/// What one enabled rule selects and does, in the form the background task needs.
#[derive(Debug, Clone, PartialEq)]
struct Rule {
    prefix: String,
    tags: Vec<(String, String)>,
    size_gt: Option<i64>,
    size_lt: Option<i64>,
    expire_days: Option<i64>,
    expire_at_secs: Option<i64>,
    abort_days: Option<i64>,
    noncurrent_days: Option<i64>,
    /// Noncurrent versions kept whatever their age (`NewerNoncurrentVersions`).
    keep_newer: usize,
    expire_markers: bool,
}

fn tag_pair(t: &Tag) -> (String, String) {
    (t.key.clone().unwrap_or_default(), t.value.clone().unwrap_or_default())
}

fn rules_of(cfg: &BucketLifecycleConfiguration) -> Vec<Rule> {
    let mut out = Vec::new();
    for r in cfg.rules.iter().filter(|r| r.status.as_str() == ExpirationStatus::ENABLED) {
        let mut rule = Rule {
            prefix: String::new(),
            tags: vec![],
            size_gt: None,
            size_lt: None,
            expire_days: None,
            expire_at_secs: None,
            abort_days: None,
            noncurrent_days: None,
            keep_newer: 0,
            expire_markers: false,
        };
        if let Some(p) = &r.prefix {
            rule.prefix = p.clone();
        }
        if let Some(f) = &r.filter {
            rule.prefix = f.prefix.clone().unwrap_or_default();
            rule.size_gt = f.object_size_greater_than;
            rule.size_lt = f.object_size_less_than;
            if let Some(t) = &f.tag {
                rule.tags.push(tag_pair(t));
            }
            if let Some(a) = &f.and {
                rule.prefix = a.prefix.clone().unwrap_or_default();
                rule.size_gt = a.object_size_greater_than;
                rule.size_lt = a.object_size_less_than;
                rule.tags.extend(a.tags.iter().flatten().map(tag_pair));
            }
        }
        if let Some(e) = &r.expiration {
            rule.expire_days = e.days.map(i64::from);
            rule.expire_at_secs = e.date.as_ref().map(unix_secs);
            rule.expire_markers = e.expired_object_delete_marker == Some(true);
        }
        if let Some(n) = &r.noncurrent_version_expiration {
            rule.noncurrent_days = n.noncurrent_days.map(i64::from);
            rule.keep_newer = n.newer_noncurrent_versions.map_or(0, |v| v.max(0) as usize);
        }
        rule.abort_days = r.abort_incomplete_multipart_upload.as_ref().and_then(|a| a.days_after_initiation).map(i64::from);
        out.push(rule);
    }
    out
}

/// When something last modified (or started) at `since_secs` is due after `days` days: as
/// S3, at the first midnight UTC at or after `since + days`.
fn due_secs(since_secs: i64, days: i64, day_secs: i64) -> i64 {
    let t = since_secs.saturating_add(days.saturating_mul(day_secs));
    t.div_euclid(day_secs).saturating_add(i64::from(t.rem_euclid(day_secs) != 0)).saturating_mul(day_secs)
}

impl Rule {
    fn selects(&self, key: &str, size: u64, tags: &[(String, String)]) -> bool {
        key.starts_with(&self.prefix)
            && self.size_gt.is_none_or(|g| size as i64 > g)
            && self.size_lt.is_none_or(|l| (size as i64) < l)
            && self.tags.iter().all(|t| tags.contains(t))
    }

    fn expired(&self, mtime_secs: i64, now_secs: i64, day_secs: i64) -> bool {
        self.expire_at_secs.is_some_and(|at| now_secs >= at) || self.expire_days.is_some_and(|d| now_secs >= due_secs(mtime_secs, d, day_secs))
    }
}

/// Carries out every bucket's lifecycle rules once, as of `now_secs` (Unix seconds).
/// Returns the number of objects deleted and uploads aborted. The S3 listener runs it
/// hourly; it is public so that tests (and tools) can run a pass for a given time.
pub fn lifecycle_pass(engine: &Engine, now_secs: i64) -> usize {
    lifecycle_pass_with_day(engine, now_secs, DAY_SECS)
}

/// [`lifecycle_pass`] with a lifecycle day of `day_secs` seconds (at least 1).
pub fn lifecycle_pass_with_day(engine: &Engine, now_secs: i64, day_secs: i64) -> usize {
    let day_secs = day_secs.max(1);
    let sys = Caller::system();
    let mut done = 0;
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let Ok(page) = engine.readdir(&sys, ROOT_INO, cursor.as_deref(), 1024) else { return done };
        for e in page.entries {
            if e.kind != FileKind::Dir || done >= ACTIONS_PER_PASS_MAX {
                continue;
            }
            let Ok(doc) = engine.getxattr(&sys, e.ino, XATTR_LIFECYCLE) else { continue };
            let Some(cfg) = decode(&doc) else {
                tracing::warn!(bucket = %String::from_utf8_lossy(&e.name), "stored lifecycle configuration does not parse; skipped");
                continue;
            };
            let rules = rules_of(&cfg);
            if !rules.is_empty() {
                done += bucket_pass(engine, e.ino, &String::from_utf8_lossy(&e.name), &rules, now_secs, day_secs, ACTIONS_PER_PASS_MAX - done);
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return done,
        }
    }
}

fn bucket_pass(engine: &Engine, bucket: storage_engine::Ino, name: &str, rules: &[Rule], now_secs: i64, day_secs: i64, budget: usize) -> usize {
    let sys = Caller::system();
    let Ok(battr) = engine.getattr(&sys, bucket) else { return 0 };
    // Expiration deletes with the bucket owner's permissions: the owner set the rule.
    let owner = crate::auth::owner_caller(engine, &battr);
    let mut done = 0;
    let expiring: Vec<&Rule> = rules.iter().filter(|r| r.expire_days.is_some() || r.expire_at_secs.is_some()).collect();
    if !expiring.is_empty() {
        let mut start_after: Vec<u8> = Vec::new();
        'pages: loop {
            let Ok(page) = engine.list_objects(&sys, bucket, b"", None, &start_after, LIST_PAGE_KEYS) else { break };
            for o in &page.objects {
                if done >= budget {
                    break 'pages;
                }
                let Ok(key) = std::str::from_utf8(&o.key) else { continue };
                // Objects, and folder objects (`prefix/`, listed as directories).
                if !matches!(o.attr.kind, FileKind::File | FileKind::Dir) {
                    continue;
                }
                let mtime = o.attr.mtime_ns.div_euclid(1_000_000_000);
                let candidates: Vec<&&Rule> = expiring.iter().filter(|r| key.starts_with(&r.prefix) && r.expired(mtime, now_secs, day_secs)).collect();
                if candidates.is_empty() {
                    continue;
                }
                let tags = if candidates.iter().any(|r| !r.tags.is_empty()) {
                    engine.getxattr(&sys, o.attr.ino, XATTR_TAGS).map(|v| decode_tags(&v)).unwrap_or_default()
                } else {
                    vec![]
                };
                if !candidates.iter().any(|r| r.selects(key, o.attr.size, &tags)) {
                    continue;
                }
                match crate::service::delete_key(engine, &owner, bucket, key) {
                    Ok(()) => {
                        done += 1;
                        tracing::debug!(bucket = name, key, "lifecycle expiration deleted object");
                    }
                    Err(e) => tracing::warn!(bucket = name, key, error = %e, "lifecycle expiration could not delete object"),
                }
            }
            match page.next_start_after {
                Some(s) => start_after = s,
                None => break,
            }
        }
    }
    if rules.iter().any(|r| r.noncurrent_days.is_some() || r.expire_markers) && engine.bucket_has_versions(bucket).unwrap_or(false) {
        done += versions_pass(engine, bucket, name, &owner, rules, now_secs, day_secs, budget - done.min(budget));
    }
    if rules.iter().any(|r| r.abort_days.is_some())
        && let Ok(uploads) = engine.multipart_list_uploads(&sys, bucket)
    {
        for u in uploads {
            if done >= budget {
                break;
            }
            let started = u.created_ns.div_euclid(1_000_000_000);
            let due = rules.iter().any(|r| r.abort_days.is_some_and(|d| u.key.starts_with(&r.prefix) && now_secs >= due_secs(started, d, day_secs)));
            if due {
                match engine.multipart_abort(&sys, &u.id) {
                    Ok(()) => done += 1,
                    Err(e) => tracing::warn!(bucket = name, key = %u.key, error = %e, "lifecycle could not abort multipart upload"),
                }
            }
        }
    }
    done
}

/// Deletes the noncurrent versions that `NoncurrentVersionExpiration` rules make due, and
/// delete markers left as a key's only version under `ExpiredObjectDeleteMarker`; with the
/// bucket owner's permissions. Returns how many it deleted.
fn versions_pass(engine: &Engine, bucket: storage_engine::Ino, name: &str, owner: &Caller, rules: &[Rule], now_secs: i64, day_secs: i64, budget: usize) -> usize {
    let sys = Caller::system();
    let mut due: Vec<(String, String)> = Vec::new();
    // The versions of one key, newest first, gathered across pages.
    let mut group: Vec<storage_engine::VersionEntry> = Vec::new();
    let judge = |group: &mut Vec<storage_engine::VersionEntry>, due: &mut Vec<(String, String)>| {
        let first_due = due.len();
        let mut noncurrent = 0usize;
        for v in group.iter().filter(|v| !v.current) {
            let storage_engine::VersionKind::Object(a) = &v.kind else { continue };
            noncurrent += 1;
            let since = v.successor_ns.unwrap_or(a.mtime_ns).div_euclid(1_000_000_000);
            let tags = engine.getxattr(&sys, a.ino, XATTR_TAGS).map(|t| decode_tags(&t)).unwrap_or_default();
            let expired =
                rules.iter().any(|r| r.noncurrent_days.is_some_and(|d| now_secs >= due_secs(since, d, day_secs)) && noncurrent > r.keep_newer && r.selects(&v.key, a.size, &tags));
            if expired {
                due.push((v.key.clone(), v.id.clone()));
            }
        }
        // A delete marker on top of nothing: every other version is gone, or going now.
        if let Some(m) = group.first()
            && m.latest
            && matches!(m.kind, storage_engine::VersionKind::DeleteMarker { .. })
            && group.len() - 1 == due.len() - first_due
            && rules.iter().any(|r| r.expire_markers && m.key.starts_with(&r.prefix))
        {
            due.push((m.key.clone(), m.id.clone()));
        }
        group.clear();
    };
    let (mut key_marker, mut version_marker) = (String::new(), None::<String>);
    loop {
        let Ok(page) = engine.list_versions(&sys, bucket, "", None, &key_marker, version_marker.as_deref(), LIST_PAGE_KEYS) else { break };
        for v in page.versions {
            if group.first().is_some_and(|g| g.key != v.key) {
                judge(&mut group, &mut due);
            }
            group.push(v);
        }
        if due.len() >= budget {
            break;
        }
        match page.next {
            Some((k, v)) => (key_marker, version_marker) = (k, v),
            None => {
                judge(&mut group, &mut due);
                break;
            }
        }
    }
    // Each key's marker comes after the versions below it, so none is removed too early.
    let mut done = 0;
    for (key, id) in due.into_iter().take(budget) {
        match crate::service::delete_key_version(engine, owner, bucket, &key, Some(&id)) {
            Ok(_) => {
                done += 1;
                tracing::debug!(bucket = name, key, version = id, "lifecycle expiration deleted a version");
            }
            Err(e) => tracing::warn!(bucket = name, key, version = id, error = %e, "lifecycle expiration could not delete a version"),
        }
    }
    done
}

/// How long after a configuration is put its first pass runs: configurations put together
/// (a script setting many buckets) share one pass.
const CHANGED_PASS_DELAY_MS: u64 = 500;

/// The background task: a pass every [`SCAN_INTERVAL_SECS`] (ten a lifecycle day when the
/// day is shorter), and one shortly after `changed` is notified (a configuration was put),
/// until `stop` turns true (or its sender goes away). A pass in progress is finished first:
/// each deletion is atomic, but the caller waits for this task so that the engine is not
/// used after shutdown.
pub(crate) async fn run(engine: Arc<Engine>, day_secs: u64, changed: Arc<tokio::sync::Notify>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let day_secs = day_secs.clamp(1, DAY_SECS as u64);
    let every = if day_secs < DAY_SECS as u64 { Duration::from_millis((day_secs * 100).max(100)) } else { Duration::from_secs(SCAN_INTERVAL_SECS) };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let soon = tokio::select! {
            _ = tick.tick() => false,
            _ = changed.notified() => true,
            r = stop.wait_for(|s| *s) => {
                let _ = r;
                return;
            }
        };
        if soon {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(CHANGED_PASS_DELAY_MS)) => {}
                r = stop.wait_for(|s| *s) => {
                    let _ = r;
                    return;
                }
            }
        }
        let e = engine.clone();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        match tokio::task::spawn_blocking(move || lifecycle_pass_with_day(&e, now, day_secs as i64)).await {
            Ok(n) if n > 0 => tracing::info!(actions = n, "lifecycle pass"),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "lifecycle pass failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(id: Option<&str>, status: &str) -> LifecycleRule {
        LifecycleRule {
            id: id.map(str::to_string),
            status: ExpirationStatus::from(status.to_string()),
            prefix: Some("p/".into()),
            expiration: Some(LifecycleExpiration { days: Some(3), ..Default::default() }),
            abort_incomplete_multipart_upload: None,
            filter: None,
            noncurrent_version_expiration: None,
            noncurrent_version_transitions: None,
            transitions: None,
        }
    }

    fn cfg(rules: Vec<LifecycleRule>) -> BucketLifecycleConfiguration {
        BucketLifecycleConfiguration { rules }
    }

    fn code(c: &mut BucketLifecycleConfiguration) -> String {
        check(c).unwrap_err().code().as_str().to_string()
    }

    #[test]
    fn checks_refuse_what_s3_refuses() {
        let mut ok = cfg(vec![rule(Some("a"), "Enabled"), rule(None, "Disabled")]);
        check(&mut ok).unwrap();
        assert!(ok.rules[1].id.as_ref().is_some_and(|i| !i.is_empty()), "a rule without an ID gets one");
        assert_eq!(code(&mut cfg(vec![])), "MalformedXML");
        assert_eq!(code(&mut cfg(vec![rule(Some(&"a".repeat(256)), "Enabled")])), "InvalidArgument");
        assert_eq!(code(&mut cfg(vec![rule(Some("a"), "Enabled"), rule(Some("a"), "Enabled")])), "InvalidArgument");
        assert_eq!(code(&mut cfg(vec![rule(Some("a"), "enabled")])), "MalformedXML");
        let mut r = rule(Some("a"), "Enabled");
        r.expiration = Some(LifecycleExpiration { days: Some(0), ..Default::default() });
        assert_eq!(code(&mut cfg(vec![r.clone()])), "InvalidArgument");
        r.expiration = Some(LifecycleExpiration { days: Some(1), expired_object_delete_marker: Some(true), ..Default::default() });
        assert_eq!(code(&mut cfg(vec![r.clone()])), "MalformedXML");
        let noon = Timestamp::from(std::time::UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 43_200));
        r.expiration = Some(LifecycleExpiration { date: Some(noon), ..Default::default() });
        assert_eq!(code(&mut cfg(vec![r.clone()])), "InvalidArgument");
        r.expiration = None;
        assert_eq!(code(&mut cfg(vec![r.clone()])), "InvalidArgument", "no action");
        r.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload { days_after_initiation: Some(2) });
        check(&mut cfg(vec![r.clone()])).unwrap();
        r.filter = Some(LifecycleRuleFilter::default());
        assert_eq!(code(&mut cfg(vec![r.clone()])), "MalformedXML", "Prefix and Filter");
        r.prefix = None;
        check(&mut cfg(vec![r.clone()])).unwrap();
        r.filter = Some(LifecycleRuleFilter { prefix: Some("x".into()), tag: Some(Tag { key: Some("k".into()), value: Some("v".into()) }), ..Default::default() });
        assert_eq!(code(&mut cfg(vec![r.clone()])), "MalformedXML", "two filter conditions without And");
        let mut t = rule(Some("t"), "Enabled");
        t.transitions = Some(vec![Transition { days: Some(1), storage_class: Some(TransitionStorageClass::from("GLACIER".to_string())), date: None }]);
        assert_eq!(code(&mut cfg(vec![t])), "InvalidStorageClass");
    }

    #[test]
    fn stored_form_round_trips() {
        let mut c = cfg(vec![rule(Some("a"), "Enabled"), rule(Some("b"), "Disabled")]);
        c.rules[1].prefix = None;
        c.rules[1].filter = Some(LifecycleRuleFilter {
            and: Some(LifecycleRuleAndOperator { prefix: Some("logs/".into()), tags: Some(vec![Tag { key: Some("k".into()), value: Some("v".into()) }]), ..Default::default() }),
            ..Default::default()
        });
        check(&mut c).unwrap();
        assert_eq!(decode(&encode(&c)), Some(c));
        assert_eq!(decode(b"<LifecycleConfiguration><Rule>"), None);
    }

    #[test]
    fn due_times() {
        let day = 86_400;
        // S3 rounds up to the next midnight UTC.
        assert_eq!(due_secs(10 * day + 5, 1, day), 12 * day);
        assert_eq!(due_secs(10 * day, 1, day), 11 * day);
        assert_eq!(due_secs(25, 1, 10), 40, "a shorter lifecycle day rounds up to its own multiples");
        let r = Rule { prefix: "a/".into(), tags: vec![("k".into(), "v".into())], size_gt: Some(1), size_lt: None, expire_days: Some(1), expire_at_secs: None, abort_days: None, noncurrent_days: None, keep_newer: 0, expire_markers: false };
        assert!(r.selects("a/x", 2, &[("k".into(), "v".into()), ("o".into(), "p".into())]));
        assert!(!r.selects("b/x", 2, &[("k".into(), "v".into())]));
        assert!(!r.selects("a/x", 1, &[("k".into(), "v".into())]));
        assert!(!r.selects("a/x", 2, &[("k".into(), "w".into())]));
        assert!(r.expired(0, day, day) && !r.expired(0, day - 1, day));
        assert!(r.expired(5, 2 * day, day) && !r.expired(5, 2 * day - 1, day));
    }
}
