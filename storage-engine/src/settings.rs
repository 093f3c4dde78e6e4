//! Settings and the audit log.
//!
//! Settings are small named records that subsystems above the engine keep in the metadata
//! store (SMB shares, NFS exports, portals, the cluster's region), so they share its
//! durability and, later, its replication. A setting lives under a namespace (`"smb.share"`,
//! `"portal"`) and a key; the value is opaque bytes (subsystems store JSON).
//!
//! The audit log is an append-only sequence of records (who, what, where, which protocol,
//! outcome), each with a sequence number and a time, kept in its own column family.

use std::sync::atomic::Ordering;

use rocksdb::{Direction, IteratorMode, WriteOptions};

use crate::engine::{CF_AUDIT, CF_SYSTEM, Engine};
use crate::error::{Error, Result};
use crate::types::*;

/// Longest namespace or key of a setting.
pub const SETTING_KEY_BYTES_MAX: usize = 255;
/// Largest value of a setting.
pub const SETTING_VALUE_BYTES_MAX: usize = 1 << 20;
/// Most audit records one `audit_list` call returns.
pub const AUDIT_PAGE_MAX: usize = 10_000;

const SETTING_PREFIX: &[u8] = b"setting/";

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// Assigned by the engine, increasing.
    pub seq: u64,
    /// Nanoseconds since the Unix epoch, assigned by the engine.
    pub time_ns: i64,
    /// Who: the user name of the caller.
    pub user: String,
    /// Which way in: `rest`, `s3`, `nfs`, `smb`, `sftp`, `fabric`, `cli`.
    pub protocol: String,
    /// What: e.g. `portal.create`, `portal.refused`.
    pub action: String,
    /// Where: a path, a portal id, a peer address.
    pub target: String,
    /// `ok`, or the reason for a refusal or failure.
    pub outcome: String,
}

fn setting_key(ns: &str, key: &str) -> Result<Vec<u8>> {
    for (what, s) in [("namespace", ns), ("key", key)] {
        if s.is_empty() || s.len() > SETTING_KEY_BYTES_MAX || s.contains('\0') {
            return Err(Error::InvalidArgument(format!("setting {what} must be 1..={SETTING_KEY_BYTES_MAX} bytes without NUL")));
        }
    }
    if ns.contains('/') {
        return Err(Error::InvalidArgument("setting namespace must not contain '/'".into()));
    }
    let mut k = SETTING_PREFIX.to_vec();
    k.extend_from_slice(ns.as_bytes());
    k.push(b'/');
    k.extend_from_slice(key.as_bytes());
    Ok(k)
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn get_str(buf: &mut &[u8]) -> Result<String> {
    let bad = || Error::Corrupt("audit record".into());
    if buf.len() < 4 {
        return Err(bad());
    }
    let n = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
    if buf.len() < 4 + n {
        return Err(bad());
    }
    let s = String::from_utf8(buf[4..4 + n].to_vec()).map_err(|_| bad())?;
    *buf = &buf[4 + n..];
    Ok(s)
}

impl AuditRecord {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        v.push(1); // format version
        v.extend_from_slice(&self.time_ns.to_be_bytes());
        for s in [&self.user, &self.protocol, &self.action, &self.target, &self.outcome] {
            put_str(&mut v, s);
        }
        v
    }

    fn decode(seq: u64, mut v: &[u8]) -> Result<AuditRecord> {
        if v.len() < 9 || v[0] != 1 {
            return Err(Error::Corrupt("audit record".into()));
        }
        let time_ns = i64::from_be_bytes(v[1..9].try_into().unwrap());
        v = &v[9..];
        Ok(AuditRecord {
            seq,
            time_ns,
            user: get_str(&mut v)?,
            protocol: get_str(&mut v)?,
            action: get_str(&mut v)?,
            target: get_str(&mut v)?,
            outcome: get_str(&mut v)?,
        })
    }
}

impl Engine {
    /// Stores a setting (admin only). Durable when this returns.
    pub fn setting_put(&self, caller: &Caller, ns: &str, key: &str, value: &[u8]) -> Result<()> {
        require_admin(caller)?;
        if value.len() > SETTING_VALUE_BYTES_MAX {
            return Err(Error::InvalidArgument(format!("setting value over {SETTING_VALUE_BYTES_MAX} bytes")));
        }
        let k = setting_key(ns, key)?;
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.put_cf_opt(self.cf(CF_SYSTEM), k, value, &wo)?;
        Ok(())
    }

    /// Removes a setting (admin only); `NotFound` when there was none.
    pub fn setting_delete(&self, caller: &Caller, ns: &str, key: &str) -> Result<()> {
        require_admin(caller)?;
        let k = setting_key(ns, key)?;
        let _g = self.mutate.lock();
        if self.db.get_cf(self.cf(CF_SYSTEM), &k)?.is_none() {
            return Err(Error::NotFound);
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.delete_cf_opt(self.cf(CF_SYSTEM), k, &wo)?;
        Ok(())
    }

    /// Reads a setting. Settings are read by the daemon's own subsystems, so there is no caller.
    pub fn setting_get(&self, ns: &str, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get_cf(self.cf(CF_SYSTEM), setting_key(ns, key)?)?)
    }

    /// Every setting of a namespace as (key, value), in key byte order.
    pub fn settings_list(&self, ns: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut prefix = setting_key(ns, "x")?;
        prefix.pop();
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_SYSTEM), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(&prefix) {
                break;
            }
            let key = String::from_utf8(k[prefix.len()..].to_vec()).map_err(|_| Error::Corrupt("setting key".into()))?;
            out.push((key, v.to_vec()));
        }
        Ok(out)
    }

    /// Appends an audit record; `seq` and `time_ns` of `rec` are assigned here. Durable with
    /// the next metadata sync (at most about a second later), like unstable writes.
    pub fn audit(&self, user: &str, protocol: &str, action: &str, target: &str, outcome: &str) -> Result<u64> {
        let seq = self.audit_seq.fetch_add(1, Ordering::Relaxed);
        let rec = AuditRecord {
            seq,
            time_ns: self.now(),
            user: user.into(),
            protocol: protocol.into(),
            action: action.into(),
            target: target.into(),
            outcome: outcome.into(),
        };
        self.db.put_cf(self.cf(CF_AUDIT), seq.to_be_bytes(), rec.encode())?;
        Ok(seq)
    }

    /// Audit records with `seq > after`, oldest first, at most `max` (admin and operator).
    pub fn audit_list(&self, caller: &Caller, after: u64, max: usize) -> Result<Vec<AuditRecord>> {
        if caller.role < Role::Operator {
            return Err(Error::PermissionDenied);
        }
        let start = after.saturating_add(1).to_be_bytes();
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_AUDIT), IteratorMode::From(&start, Direction::Forward)) {
            let (k, v) = kv?;
            if out.len() >= max.clamp(1, AUDIT_PAGE_MAX) {
                break;
            }
            let seq = u64::from_be_bytes(k.as_ref().try_into().map_err(|_| Error::Corrupt("audit key".into()))?);
            out.push(AuditRecord::decode(seq, &v)?);
        }
        Ok(out)
    }

    /// The next audit sequence number, found at open.
    pub(crate) fn last_audit_seq(db: &rocksdb::DB) -> Result<u64> {
        let cf = db.cf_handle(CF_AUDIT).expect("cf");
        let mut it = db.iterator_cf(cf, IteratorMode::End);
        Ok(match it.next() {
            Some(kv) => {
                let (k, _) = kv?;
                u64::from_be_bytes(k.as_ref().try_into().map_err(|_| Error::Corrupt("audit key".into()))?)
            }
            None => 0,
        })
    }
}

/// Settings namespace of per-user SFTP chroots: key = user name, value = the normalised
/// absolute path (UTF-8) of the directory that user's SFTP sessions see as `/`. The admin API
/// writes it and the SFTP service reads it at each session start; it is kept here, with its
/// checks, because neither of those crates may depend on the other (DESIGN.md §2).
pub const SFTP_CHROOT_SETTING: &str = "sftp.chroot";

/// `path` with `.`, `..` and repeated or trailing `/` taken out lexically; `..` at the root
/// stays at the root. Only absolute paths are accepted.
fn normalise_absolute(path: &str) -> Result<String> {
    if !path.starts_with('/') {
        return Err(Error::InvalidArgument(format!("{path:?} is not an absolute path")));
    }
    if path.contains('\0') {
        return Err(Error::InvalidArgument("a path must not contain NUL".into()));
    }
    let mut comps: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                comps.pop();
            }
            c => comps.push(c),
        }
    }
    Ok(format!("/{}", comps.join("/")))
}

impl Engine {
    /// Confines `user`'s SFTP sessions to the directory at `path` (admin only) and returns the
    /// path as stored, normalised. `NotFound` when there is no such user or no such path,
    /// `NotDir` when the path (which is resolved without following symlinks) is not a
    /// directory, `InvalidArgument` when it is not absolute; nothing is changed then. Sessions
    /// already open keep the root they started with; the next login gets the new one.
    pub fn sftp_chroot_set(&self, caller: &Caller, user: &str, path: &str) -> Result<String> {
        require_admin(caller)?;
        self.get_user(caller, user)?;
        let norm = normalise_absolute(path)?;
        if self.resolve(&Caller::system(), &norm)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        self.setting_put(caller, SFTP_CHROOT_SETTING, user, norm.as_bytes())?;
        Ok(norm)
    }

    /// Lifts `user`'s SFTP chroot (admin only); `NotFound` when none was set. The user need not
    /// exist any more.
    pub fn sftp_chroot_remove(&self, caller: &Caller, user: &str) -> Result<()> {
        self.setting_delete(caller, SFTP_CHROOT_SETTING, user)
    }

    /// `user`'s SFTP chroot, if an admin set one.
    pub fn sftp_chroot(&self, user: &str) -> Result<Option<String>> {
        self.setting_get(SFTP_CHROOT_SETTING, user)?
            .map(|v| String::from_utf8(v).map_err(|_| Error::Corrupt("SFTP chroot setting is not UTF-8".into())))
            .transpose()
    }

    /// Every SFTP chroot as (user, path), by user name.
    pub fn sftp_chroots(&self) -> Result<Vec<(String, String)>> {
        self.settings_list(SFTP_CHROOT_SETTING)?
            .into_iter()
            .map(|(k, v)| Ok((k, String::from_utf8(v).map_err(|_| Error::Corrupt("SFTP chroot setting is not UTF-8".into()))?)))
            .collect()
    }
}

fn require_admin(caller: &Caller) -> Result<()> {
    if caller.role >= Role::Admin { Ok(()) } else { Err(Error::PermissionDenied) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_record_round_trips_and_rejects_garbage() {
        let r = AuditRecord {
            seq: 7,
            time_ns: 123,
            user: "alice".into(),
            protocol: "rest".into(),
            action: "portal.create".into(),
            target: "/data".into(),
            outcome: "ok".into(),
        };
        assert_eq!(AuditRecord::decode(7, &r.encode()).unwrap(), r);
        let enc = r.encode();
        for n in 0..enc.len() {
            assert!(AuditRecord::decode(7, &enc[..n]).is_err());
        }
    }

    #[test]
    fn setting_keys_are_checked() {
        assert!(setting_key("", "a").is_err());
        assert!(setting_key("a/b", "a").is_err());
        assert!(setting_key("a", "").is_err());
        assert!(setting_key("a", &"x".repeat(256)).is_err());
        assert!(setting_key("portal", "p1").is_ok());
    }

    #[test]
    fn chroot_paths_are_normalised_and_must_be_absolute() {
        for (given, stored) in [("/", "/"), ("/home/./jail/", "/home/jail"), ("//a//b", "/a/b"), ("/a/../../b/..", "/"), ("/a/b/../c", "/a/c")] {
            assert_eq!(normalise_absolute(given).unwrap(), stored, "{given}");
        }
        for bad in ["", "home", "./home", "../x", "/a\0b"] {
            assert!(normalise_absolute(bad).is_err(), "{bad:?}");
        }
    }
}
