//! Cluster identities and mutual TLS between clusters (openssl).
//!
//! Each cluster has a self-signed certificate made at its first start (EC P-256, kept in
//! `DATA_DIR/fabric/`, key mode 0600). Clusters name each other by the SHA-256 fingerprint
//! of that certificate: a spoke records the hub's fingerprint when it proposes a portal (or
//! checks it against one the operator gave), and the hub records the spoke's when its admin
//! authorizes the portal. From then on both sides refuse any other certificate.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslAcceptor, SslConnector, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::{X509, X509NameBuilder};

/// This cluster's certificate and key.
#[derive(Clone)]
pub struct Identity {
    pub cert: X509,
    pub key: PKey<Private>,
    pub fingerprint: String,
}

pub fn fingerprint(cert: &X509) -> String {
    hex::encode(cert.digest(MessageDigest::sha256()).expect("sha256 digest"))
}

impl Identity {
    /// Loads the identity from `dir`, creating it on first use.
    pub fn load_or_create(dir: &Path, name: &str) -> Result<Identity> {
        let cert_path = dir.join("cluster-cert.pem");
        let key_path = dir.join("cluster-key.pem");
        if cert_path.exists() && key_path.exists() {
            let cert = X509::from_pem(&std::fs::read(&cert_path)?).context("reading the fabric certificate")?;
            let key = PKey::private_key_from_pem(&std::fs::read(&key_path)?).context("reading the fabric key")?;
            let fingerprint = fingerprint(&cert);
            return Ok(Identity { cert, key, fingerprint });
        }
        std::fs::create_dir_all(dir)?;
        let id = Self::generate(name)?;
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&key_path)?;
        std::io::Write::write_all(&mut f, &id.key.private_key_to_pem_pkcs8()?)?;
        f.sync_all()?;
        std::fs::write(&cert_path, id.cert.to_pem()?)?;
        Ok(id)
    }

    /// A fresh self-signed identity (also used by tests to play an impostor).
    pub fn generate(name: &str) -> Result<Identity> {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
        let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
        let mut nb = X509NameBuilder::new()?;
        nb.append_entry_by_nid(Nid::COMMONNAME, &format!("aquifer cluster {name}"))?;
        let subject = nb.build();
        let mut b = X509::builder()?;
        b.set_version(2)?;
        let mut serial = BigNum::new()?;
        serial.rand(127, MsbOption::MAYBE_ZERO, false)?;
        let serial = serial.to_asn1_integer()?;
        b.set_serial_number(&serial)?;
        b.set_subject_name(&subject)?;
        b.set_issuer_name(&subject)?;
        b.set_pubkey(&key)?;
        let not_before = Asn1Time::days_from_now(0)?;
        b.set_not_before(&not_before)?;
        let not_after = Asn1Time::days_from_now(3650)?;
        b.set_not_after(&not_after)?;
        b.sign(&key, MessageDigest::sha256())?;
        let cert = b.build();
        let fingerprint = fingerprint(&cert);
        Ok(Identity { cert, key, fingerprint })
    }

    /// Server side: TLS 1.3, a client certificate required (checked against portal records
    /// after the handshake, since which one is right depends on the portal named).
    pub fn acceptor(&self) -> Result<SslAcceptor> {
        let mut b = SslAcceptor::mozilla_modern_v5(SslMethod::tls_server())?;
        b.set_certificate(&self.cert)?;
        b.set_private_key(&self.key)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
        b.set_verify_callback(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT, |_, _| true);
        Ok(b.build())
    }

    /// Client side: presents this identity; the server's certificate is checked against the
    /// pinned fingerprint after the handshake.
    pub fn connector(&self) -> Result<SslConnector> {
        let mut b = SslConnector::builder(SslMethod::tls_client())?;
        b.set_certificate(&self.cert)?;
        b.set_private_key(&self.key)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
        b.set_verify_callback(SslVerifyMode::PEER, |_, _| true);
        Ok(b.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_created_once_and_reloaded() {
        let d = tempfile::tempdir().unwrap();
        let a = Identity::load_or_create(d.path(), "a").unwrap();
        let b = Identity::load_or_create(d.path(), "a").unwrap();
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.fingerprint.len(), 64);
        let c = Identity::generate("a").unwrap();
        assert_ne!(a.fingerprint, c.fingerprint);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(d.path().join("cluster-key.pem")).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
