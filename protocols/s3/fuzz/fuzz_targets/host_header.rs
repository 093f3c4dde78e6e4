//! Fuzzes virtual-host matching (protocols/s3/src/vhost.rs, compiled here unchanged): every
//! request's Host header goes through it when `--s3-domain` is set.
//!
//!     RUSTC_BOOTSTRAP=1 cargo fuzz run host_header -- -max_total_time=120
//!
//! Input: the domain, then after a NUL byte the Host header.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/vhost.rs"]
#[allow(dead_code)]
mod vhost;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (domain, host) = text.split_once('\0').unwrap_or(("s3.example.com", text));
    let Ok(d) = vhost::Domain::new(domain) else { return };
    assert!(!d.name().contains(':') && d.name() == d.name().to_ascii_lowercase());
    if let Some(bucket) = d.bucket_of(host) {
        // The bucket is the host's lower-cased label(s) before `.DOMAIN`, port aside.
        let name = host.split(':').next().unwrap();
        let name = name.strip_suffix('.').unwrap_or(name);
        assert!(!bucket.is_empty() && bucket == bucket.to_ascii_lowercase());
        let suffix = format!(".{}", d.name());
        assert!(name.to_ascii_lowercase().ends_with(&suffix), "{host:?} gave {bucket:?}");
        assert_eq!(bucket, name[..name.len() - suffix.len()].to_ascii_lowercase());
    }
});
