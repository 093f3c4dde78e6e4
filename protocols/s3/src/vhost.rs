//! Virtual-host style addressing (`aquifer serve --s3-domain DOMAIN`): a request to
//! `bucket.DOMAIN`, on any port and in any case, names the bucket; every other host —
//! DOMAIN itself, an IP address, `localhost`, any other name — is path style, so path-style
//! clients keep working whatever name they use for the appliance.
//!
//! s3s's own `SingleDomain` compares the Host header with its port (a client on port 9000
//! sends `bucket.DOMAIN:9000`, which it does not match) and takes any other host name for a
//! bucket (`localhost:9000` would be one), so Aquifer matches hosts itself (the listener's
//! `S3Host` is in server.rs; this file has no s3s types, so the fuzz target compiles it alone).

/// The base domain, lower case, checked when the listener starts.
#[derive(Debug, Clone)]
pub(crate) struct Domain(String);

impl Domain {
    /// `domain` as given on the command line or in the config: a DNS name without a port.
    pub(crate) fn new(domain: &str) -> anyhow::Result<Domain> {
        let d = domain.trim_end_matches('.').to_ascii_lowercase();
        if d.contains(':') {
            anyhow::bail!("S3 domain {domain:?}: give the host name alone, without a port (bucket.DOMAIN is matched on every port)");
        }
        let labels_ok = !d.is_empty()
            && d.len() <= 253
            && d.split('.').all(|l| !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-') && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if !labels_ok {
            anyhow::bail!("S3 domain {domain:?} is not a DNS name (labels of letters, digits and '-', separated by '.')");
        }
        Ok(Domain(d))
    }

    /// The domain, lower case.
    pub(crate) fn name(&self) -> &str {
        &self.0
    }

    /// The bucket `host` (a Host header: a name, maybe with a port) names, lower case; `None`
    /// for a path-style request.
    pub(crate) fn bucket_of(&self, host: &str) -> Option<String> {
        if host.starts_with('[') {
            return None; // an IPv6 literal
        }
        let name = host.split(':').next().unwrap_or(host);
        let name = name.strip_suffix('.').unwrap_or(name);
        let cut = name.len().checked_sub(self.0.len() + 1)?;
        let (bucket, rest) = (name.get(..cut)?, name.get(cut..)?);
        let rest = rest.strip_prefix('.')?;
        (!bucket.is_empty() && rest.eq_ignore_ascii_case(&self.0)).then(|| bucket.to_ascii_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_named_by_the_domain_on_any_port_and_other_hosts_are_path_style() {
        let d = Domain::new("S3.Example.COM").unwrap();
        assert_eq!(d.0, "s3.example.com");
        for (host, bucket) in [
            ("photos.s3.example.com", Some("photos")),
            ("photos.s3.example.com:9000", Some("photos")),
            ("Photos.S3.EXAMPLE.com:9000", Some("photos")),
            ("my.dotted.bucket.s3.example.com", Some("my.dotted.bucket")),
            ("photos.s3.example.com.:9000", Some("photos")),
            ("s3.example.com", None),
            ("s3.example.com:9000", None),
            (".s3.example.com", None),
            ("xs3.example.com", None),
            ("photos.s3.example.org", None),
            ("localhost:9000", None),
            ("127.0.0.1:9000", None),
            ("[::1]:9000", None),
            ("", None),
        ] {
            assert_eq!(d.bucket_of(host).as_deref(), bucket, "{host}");
        }
    }

    #[test]
    fn domains_with_ports_or_bad_labels_are_refused() {
        for bad in ["", ".", "s3.example.com:9000", "s3..example.com", "-s3.example.com", "s3_x.example.com", "s3.example.com/x"] {
            assert!(Domain::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Domain::new("s3.example.com.").unwrap().0, "s3.example.com");
        assert_eq!(Domain::new("localhost").unwrap().0, "localhost");
    }
}
