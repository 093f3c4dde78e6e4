//! Bucket CORS configurations (PutBucketCors, GetBucketCors, DeleteBucketCors) and what they
//! let browsers do: a page from another origin may call the S3 API of a bucket (a labelling
//! tool uploading with presigned URLs, a dataset viewer reading objects) only where the
//! bucket's rules allow its origin, method and headers, as in S3.
//!
//! - A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered by
//!   the listener itself, unauthenticated as browsers send it: `200` with the
//!   `Access-Control-Allow-*` headers of the first rule that allows it, `403 AccessForbidden`
//!   when none does or the bucket has no configuration, `400` without `Origin` or without a
//!   method asked for.
//! - Any other request carrying `Origin` gets the headers of the first rule that allows its
//!   origin and method, whatever its answer (a browser shows the page an error's body only
//!   with them); requests without `Origin` are not looked at.
//!
//! Matching as S3: an origin or header pattern holds at most one `*`, which stands for any
//! run of characters; origins match case-sensitively, header names not; methods are `GET`,
//! `PUT`, `POST`, `DELETE` and `HEAD`. The configuration is stored as its XML in the bucket
//! directory's extended attribute [`crate::meta::XATTR_CORS`].

use s3s::dto::{CORSConfiguration, CORSRule};
use s3s::{S3Error, S3ErrorCode, S3Result};

/// Rules in one configuration, as S3.
pub const RULES_MAX: usize = 100;
/// Methods a rule may allow.
const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg.into())
}

/// Checks a configuration as S3 does; a refused one is not stored.
pub fn check(cfg: &CORSConfiguration) -> S3Result<()> {
    if cfg.cors_rules.is_empty() {
        return Err(S3Error::with_message(S3ErrorCode::MalformedXML, "a CORS configuration needs at least one CORSRule"));
    }
    if cfg.cors_rules.len() > RULES_MAX {
        return Err(invalid(format!("a CORS configuration holds at most {RULES_MAX} rules")));
    }
    for r in &cfg.cors_rules {
        if r.allowed_methods.is_empty() || r.allowed_origins.is_empty() {
            return Err(S3Error::with_message(S3ErrorCode::MalformedXML, "each CORSRule needs an AllowedMethod and an AllowedOrigin"));
        }
        if let Some(m) = r.allowed_methods.iter().find(|m| !METHODS.contains(&m.as_str())) {
            return Err(invalid(format!("Found unsupported HTTP method in CORS config. Unsupported method is {m}")));
        }
        if let Some(o) = r.allowed_origins.iter().find(|o| o.matches('*').count() > 1) {
            return Err(invalid(format!("AllowedOrigin \"{o}\" can not have more than one wildcard.")));
        }
        if let Some(h) = r.allowed_headers.iter().flatten().find(|h| h.matches('*').count() > 1) {
            return Err(invalid(format!("AllowedHeader \"{h}\" can not have more than one wildcard.")));
        }
        if r.id.as_ref().is_some_and(|id| id.len() > 255) {
            return Err(invalid("a CORSRule's ID is at most 255 characters"));
        }
        if r.max_age_seconds.is_some_and(|s| s < 0) {
            return Err(invalid("MaxAgeSeconds must not be negative"));
        }
    }
    Ok(())
}

pub fn encode(cfg: &CORSConfiguration) -> Vec<u8> {
    crate::meta::xml_encode("CORSConfiguration", cfg)
}

pub fn decode(b: &[u8]) -> Option<CORSConfiguration> {
    crate::meta::xml_decode("CORSConfiguration", b)
}

/// Whether `s` matches `pattern`, in which one `*` stands for any run of characters.
fn matches(pattern: &str, s: &str, ignore_case: bool) -> bool {
    let eq = |a: &str, b: &str| if ignore_case { a.eq_ignore_ascii_case(b) } else { a == b };
    match pattern.split_once('*') {
        None => eq(pattern, s),
        Some((head, tail)) => {
            s.len() >= head.len() + tail.len()
                && s.is_char_boundary(head.len())
                && s.is_char_boundary(s.len() - tail.len())
                && eq(&s[..head.len()], head)
                && eq(&s[s.len() - tail.len()..], tail)
        }
    }
}

/// The first rule that allows a request from `origin` with `method` that sends `headers`
/// (the preflight's `Access-Control-Request-Headers`; none for other requests).
pub fn find<'c>(cfg: &'c CORSConfiguration, origin: &str, method: &str, headers: &[&str]) -> Option<&'c CORSRule> {
    cfg.cors_rules.iter().find(|r| {
        r.allowed_methods.iter().any(|m| m == method)
            && r.allowed_origins.iter().any(|o| matches(o, origin, false))
            && headers.iter().all(|h| r.allowed_headers.iter().flatten().any(|p| matches(p, h, true)))
    })
}

/// The response headers that let the browser hand the answer to the page: for a preflight
/// (`preflight`: the headers it asked for) also the methods, headers and cache time allowed.
pub fn response_headers(rule: &CORSRule, origin: &str, preflight: Option<&[&str]>) -> Vec<(http::HeaderName, String)> {
    use http::header::*;
    let any_origin = rule.allowed_origins.iter().any(|o| o == "*");
    let mut out = vec![(ACCESS_CONTROL_ALLOW_ORIGIN, if any_origin { "*".to_string() } else { origin.to_string() })];
    if !any_origin {
        out.push((ACCESS_CONTROL_ALLOW_CREDENTIALS, "true".into()));
    }
    out.push((ACCESS_CONTROL_ALLOW_METHODS, rule.allowed_methods.join(", ")));
    match preflight {
        Some(asked) => {
            if !asked.is_empty() {
                out.push((ACCESS_CONTROL_ALLOW_HEADERS, asked.join(", ")));
            }
            if let Some(s) = rule.max_age_seconds {
                out.push((ACCESS_CONTROL_MAX_AGE, s.to_string()));
            }
        }
        None => {
            if let Some(e) = rule.expose_headers.as_ref().filter(|e| !e.is_empty()) {
                out.push((ACCESS_CONTROL_EXPOSE_HEADERS, e.join(", ")));
            }
        }
    }
    out.push((VARY, "Origin, Access-Control-Request-Headers, Access-Control-Request-Method".into()));
    out
}

/// The header names of a preflight's `Access-Control-Request-Headers`, lower-cased.
pub fn requested_headers(v: Option<&str>) -> Vec<String> {
    v.map(|v| v.split(',').map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(origins: &[&str], methods: &[&str], headers: Option<&[&str]>) -> CORSRule {
        CORSRule {
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            allowed_methods: methods.iter().map(|s| s.to_string()).collect(),
            allowed_headers: headers.map(|h| h.iter().map(|s| s.to_string()).collect()),
            expose_headers: Some(vec!["ETag".into()]),
            id: None,
            max_age_seconds: Some(600),
        }
    }

    #[test]
    fn origins_methods_and_headers_match_as_in_s3() {
        let cfg = CORSConfiguration {
            cors_rules: vec![
                rule(&["*suffix"], &["GET"], None),
                rule(&["start*end"], &["GET"], None),
                rule(&["prefix*"], &["GET"], None),
                rule(&["https://*.example.com"], &["PUT", "POST"], Some(&["content-type", "x-amz-*"])),
                rule(&["*"], &["HEAD"], None),
            ],
        };
        check(&cfg).unwrap();
        let first = |o: &str, m: &str, h: &[&str]| find(&cfg, o, m, h).map(|r| cfg.cors_rules.iter().position(|x| std::ptr::eq(x, r)).unwrap());
        assert_eq!(first("foo.suffix", "GET", &[]), Some(0));
        assert_eq!(first("suffix", "GET", &[]), Some(0));
        assert_eq!(first("foo.suffix.get", "GET", &[]), None);
        assert_eq!(first("startend", "GET", &[]), Some(1));
        assert_eq!(first("start12end", "GET", &[]), Some(1));
        assert_eq!(first("0start12end", "GET", &[]), None);
        assert_eq!(first("prefix.x", "GET", &[]), Some(2));
        assert_eq!(first("bla.prefix", "GET", &[]), None);
        assert_eq!(first("foo.suffix", "PUT", &[]), None);
        assert_eq!(first("https://a.example.com", "PUT", &["content-type", "x-amz-date", "X-Amz-Meta-Label"]), Some(3));
        assert_eq!(first("https://a.example.com", "PUT", &["authorization"]), None, "a header the rule does not allow");
        assert_eq!(first("http://a.example.com", "PUT", &[]), None, "origins match case and scheme");
        assert_eq!(first("HTTPS://A.EXAMPLE.COM", "PUT", &[]), None);
        assert_eq!(first("anything at all", "HEAD", &[]), Some(4));
        assert_eq!(first("foo.suffix", "get", &[]), None, "methods are upper case");
        // A wildcard's ends that fall inside a character do not match (nor split it).
        assert!(!matches("a*", "é", false));
        assert!(!matches("*a", "é", false));
        assert!(matches("*é", "aé", false));
    }

    #[test]
    fn response_headers_name_the_origin_or_any() {
        let r = rule(&["https://a.example.com"], &["GET", "PUT"], Some(&["*"]));
        let h = response_headers(&r, "https://a.example.com", None);
        let get = |n: &http::HeaderName| h.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get(&http::header::ACCESS_CONTROL_ALLOW_ORIGIN), Some("https://a.example.com"));
        assert_eq!(get(&http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS), Some("true"));
        assert_eq!(get(&http::header::ACCESS_CONTROL_ALLOW_METHODS), Some("GET, PUT"));
        assert_eq!(get(&http::header::ACCESS_CONTROL_EXPOSE_HEADERS), Some("ETag"));
        assert_eq!(get(&http::header::ACCESS_CONTROL_MAX_AGE), None);
        let h = response_headers(&rule(&["*"], &["GET"], None), "https://b.example", Some(&["x-amz-date", "content-type"]));
        let get = |n: &http::HeaderName| h.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get(&http::header::ACCESS_CONTROL_ALLOW_ORIGIN), Some("*"));
        assert_eq!(get(&http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS), None);
        assert_eq!(get(&http::header::ACCESS_CONTROL_ALLOW_HEADERS), Some("x-amz-date, content-type"));
        assert_eq!(get(&http::header::ACCESS_CONTROL_MAX_AGE), Some("600"));
        assert_eq!(requested_headers(Some(" X-Amz-Date ,content-type,, ")), ["x-amz-date", "content-type"]);
    }

    #[test]
    fn configurations_s3_refuses_are_refused_and_others_round_trip() {
        let ok = CORSConfiguration { cors_rules: vec![rule(&["https://*.example.com", "*"], &["GET", "HEAD"], Some(&["x-amz-*"]))] };
        check(&ok).unwrap();
        let back = decode(&encode(&ok)).unwrap();
        assert_eq!(back, ok);
        assert!(decode(b"<CORSConfiguration><CORSRule>").is_none());
        let code = |cfg: CORSConfiguration| check(&cfg).unwrap_err().code().clone();
        assert_eq!(code(CORSConfiguration { cors_rules: vec![] }), S3ErrorCode::MalformedXML);
        assert_eq!(code(CORSConfiguration { cors_rules: vec![rule(&["*"], &["PATCH"], None)] }), S3ErrorCode::InvalidRequest);
        assert_eq!(code(CORSConfiguration { cors_rules: vec![rule(&["*.*.example"], &["GET"], None)] }), S3ErrorCode::InvalidRequest);
        assert_eq!(code(CORSConfiguration { cors_rules: vec![rule(&["*"], &["GET"], Some(&["*-*"]))] }), S3ErrorCode::InvalidRequest);
        assert_eq!(code(CORSConfiguration { cors_rules: vec![rule(&[], &["GET"], None)] }), S3ErrorCode::MalformedXML);
        assert_eq!(code(CORSConfiguration { cors_rules: vec![rule(&["*"], &["GET"], None); RULES_MAX + 1] }), S3ErrorCode::InvalidRequest);
    }
}
