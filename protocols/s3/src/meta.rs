//! What the S3 adapter stores in extended attributes, and in which format.
//!
//! | xattr | on | value |
//! |---|---|---|
//! | `aquifer.s3.etag` | object | `1 <etag> <size> <mtime_ns>`: the ETag and the data state it belongs to |
//! | `aquifer.s3.meta` | object | JSON: content headers and `x-amz-meta-*` |
//! | `aquifer.s3.tags` | object | JSON: the tag set as `[[key, value], ...]` |
//! | `aquifer.s3.public-read` | bucket directory | `1`: anonymous clients may read |
//! | `aquifer.s3.policy` | bucket directory | the bucket policy (JSON) as the owner put it, checked by `policy::Policy::parse` |
//! | `aquifer.s3.acl` | bucket directory or object | an ACL the mode view cannot say: `1 <owner uid>` then one grant a line (`acl::Acl::encode`) |
//! | `aquifer.s3.lifecycle` | bucket directory | the lifecycle configuration as S3 XML (`<LifecycleConfiguration>`), checked by `lifecycle::check` |
//! | `aquifer.s3.versioning` | bucket directory | `Enabled` or `Suspended`; absent: never versioned |
//!
//! The ETag is valid while the file's size and mtime are those recorded with it. The engine
//! bumps an inode's `version` for every attribute change too (setting this very xattr, or a
//! tag, would invalidate it), while every data change sets mtime; so (size, mtime_ns) is the
//! validator. A file rewritten through another protocol gets a new mtime and its stale ETag
//! is recomputed (MD5 of the content) on demand.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

pub const XATTR_ETAG: &[u8] = b"aquifer.s3.etag";
pub const XATTR_META: &[u8] = b"aquifer.s3.meta";
pub const XATTR_TAGS: &[u8] = b"aquifer.s3.tags";
pub const XATTR_PUBLIC_READ: &[u8] = b"aquifer.s3.public-read";
pub const XATTR_POLICY: &[u8] = b"aquifer.s3.policy";
pub const XATTR_LIFECYCLE: &[u8] = b"aquifer.s3.lifecycle";
pub const XATTR_CORS: &[u8] = b"aquifer.s3.cors";
pub const XATTR_ACL: &[u8] = b"aquifer.s3.acl";
pub const XATTR_VERSIONING: &[u8] = b"aquifer.s3.versioning";
pub const XATTR_PARTS: &[u8] = b"aquifer.s3.parts";

/// An ETag together with the data state (size, mtime) it was computed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredEtag {
    pub etag: String,
    pub size: u64,
    pub mtime_ns: i64,
}

impl StoredEtag {
    pub fn encode(&self) -> Vec<u8> {
        format!("1 {} {} {}", self.etag, self.size, self.mtime_ns).into_bytes()
    }

    pub fn decode(b: &[u8]) -> Option<StoredEtag> {
        let s = std::str::from_utf8(b).ok()?;
        let mut it = s.split(' ');
        if it.next()? != "1" {
            return None;
        }
        let etag = it.next()?.to_string();
        let size = it.next()?.parse().ok()?;
        let mtime_ns = it.next()?.parse().ok()?;
        if it.next().is_some() || etag.is_empty() {
            return None;
        }
        Some(StoredEtag { etag, size, mtime_ns })
    }
}

/// The sizes of a multipart object's parts, in order (`aquifer.s3.parts`), for GET and HEAD
/// by `partNumber`. Valid while the file's size and mtime are those recorded, as the ETag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredParts {
    pub size: u64,
    pub mtime_ns: i64,
    pub parts: Vec<u64>,
}

impl StoredParts {
    pub fn encode(&self) -> Vec<u8> {
        let parts: Vec<String> = self.parts.iter().map(|p| p.to_string()).collect();
        format!("1 {} {} {}", self.size, self.mtime_ns, parts.join(",")).into_bytes()
    }

    pub fn decode(b: &[u8]) -> Option<StoredParts> {
        let s = std::str::from_utf8(b).ok()?;
        let mut it = s.split(' ');
        if it.next()? != "1" {
            return None;
        }
        let size: u64 = it.next()?.parse().ok()?;
        let mtime_ns = it.next()?.parse().ok()?;
        let parts = it.next()?.split(',').map(|p| p.parse().ok()).collect::<Option<Vec<u64>>>()?;
        if it.next().is_some() || parts.is_empty() || parts.iter().try_fold(0u64, |a, p| a.checked_add(*p))? != size {
            return None;
        }
        Some(StoredParts { size, mtime_ns, parts })
    }
}

/// Content headers and user metadata of an object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ObjectMeta {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    /// The `Expires` header as the client sent it (an HTTP date), returned as stored.
    pub expires: Option<String>,
    /// `x-amz-meta-*` without the prefix, names lower-cased.
    pub user: BTreeMap<String, String>,
}

const FIELDS: [&str; 6] = ["content-type", "content-encoding", "content-disposition", "content-language", "cache-control", "expires"];

impl ObjectMeta {
    fn fields(&self) -> [&Option<String>; 6] {
        [&self.content_type, &self.content_encoding, &self.content_disposition, &self.content_language, &self.cache_control, &self.expires]
    }

    fn fields_mut(&mut self) -> [&mut Option<String>; 6] {
        [
            &mut self.content_type,
            &mut self.content_encoding,
            &mut self.content_disposition,
            &mut self.content_language,
            &mut self.cache_control,
            &mut self.expires,
        ]
    }

    pub fn is_empty(&self) -> bool {
        self == &ObjectMeta::default()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut m = Map::new();
        for (name, v) in FIELDS.iter().zip(self.fields()) {
            if let Some(v) = v {
                m.insert(name.to_string(), Value::String(v.clone()));
            }
        }
        if !self.user.is_empty() {
            let user: Map<String, Value> = self.user.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
            m.insert("user".into(), Value::Object(user));
        }
        serde_json::to_vec(&Value::Object(m)).expect("a JSON map of strings serializes")
    }

    /// Decodes what `encode` wrote; unknown or malformed parts are ignored (the object
    /// stays readable, only the damaged headers are lost).
    pub fn decode(b: &[u8]) -> ObjectMeta {
        let mut out = ObjectMeta::default();
        let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(b) else { return out };
        for (name, slot) in FIELDS.iter().zip(out.fields_mut()) {
            if let Some(Value::String(s)) = m.get(*name) {
                *slot = Some(s.clone());
            }
        }
        if let Some(Value::Object(u)) = m.get("user") {
            for (k, v) in u {
                if let Value::String(v) = v {
                    out.user.insert(k.clone(), v.clone());
                }
            }
        }
        out
    }
}

/// Most tags on one object (as S3).
pub const TAGS_MAX: usize = 10;
pub const TAG_KEY_BYTES_MAX: usize = 128;
pub const TAG_VALUE_BYTES_MAX: usize = 256;

/// Tags are stored sorted by key: a tag set has no order, and a canonical one makes
/// GetObjectTagging answer the same whichever order the set was sent in.
pub(crate) fn encode_tags(tags: &[(String, String)]) -> Vec<u8> {
    let mut tags: Vec<&(String, String)> = tags.iter().collect();
    tags.sort();
    let v: Vec<Value> = tags.iter().map(|(k, v)| Value::Array(vec![Value::String(k.clone()), Value::String(v.clone())])).collect();
    serde_json::to_vec(&Value::Array(v)).expect("a JSON array of strings serializes")
}

pub(crate) fn decode_tags(b: &[u8]) -> Vec<(String, String)> {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(b) else { return vec![] };
    items
        .into_iter()
        .filter_map(|it| match it {
            Value::Array(mut kv) if kv.len() == 2 => match (kv.pop(), kv.pop()) {
                (Some(Value::String(v)), Some(Value::String(k))) => Some((k, v)),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_etag_round_trips_and_rejects_garbage() {
        let e = StoredEtag { etag: "\"abc-2\"".into(), size: 7, mtime_ns: -3 };
        assert_eq!(StoredEtag::decode(&e.encode()), Some(e));
        assert_eq!(StoredEtag::decode(b"2 x 1 1"), None);
        assert_eq!(StoredEtag::decode(b"1 x 1"), None);
        assert_eq!(StoredEtag::decode(b"1 x y 1"), None);
    }

    #[test]
    fn object_meta_and_tags_round_trip() {
        let mut m = ObjectMeta {
            content_type: Some("text/plain".into()),
            cache_control: Some("no-cache".into()),
            expires: Some("Wed, 21 Oct 2015 07:28:00 GMT".into()),
            ..Default::default()
        };
        m.user.insert("color".into(), "blue".into());
        assert_eq!(ObjectMeta::decode(&m.encode()), m);
        assert!(ObjectMeta::decode(b"not json").is_empty());
        let tags = vec![("a".to_string(), "1".to_string()), ("b c".to_string(), String::new())];
        assert_eq!(decode_tags(&encode_tags(&tags)), tags);
        let unsorted = vec![("foo".to_string(), "bar".to_string()), ("bar".to_string(), String::new())];
        assert_eq!(decode_tags(&encode_tags(&unsorted)), vec![unsorted[1].clone(), unsorted[0].clone()]);
    }
}

/// A bucket setting's stored form: the configuration as the S3 XML document `root`.
pub(crate) fn xml_encode<T: s3s::xml::SerializeContent>(root: &str, v: &T) -> Vec<u8> {
    let mut buf = Vec::new();
    s3s::xml::Serializer::new(&mut buf).content(root, v).expect("XML into memory cannot fail");
    buf
}

/// Reads back what [`xml_encode`] stored; `None` for anything else.
pub(crate) fn xml_decode<'a, T: s3s::xml::DeserializeContent<'a>>(root: &str, b: &'a [u8]) -> Option<T> {
    let mut d = s3s::xml::Deserializer::new(b);
    let v = d.named_element(root, T::deserialize_content).ok()?;
    d.expect_eof().ok()?;
    Some(v)
}
