//! Users, groups and API tokens (DESIGN.md §3.4). Passwords are argon2id hashes; tokens are
//! random secrets of which only a BLAKE3 hash is stored.

use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions};

use crate::engine::{CF_IDENTITY, Engine};
use crate::error::{Error, Result};
use crate::records::{GroupRec, TokenRec, UserRec};
use crate::types::{Caller, Role};

/// First uid/gid handed out automatically.
const ID_AUTO_FIRST: u32 = 1000;
/// How long a verified password is remembered, so that HTTP Basic auth on every request does
/// not pay argon2 each time.
const AUTH_CACHE_TTL: Duration = Duration::from_secs(60);
const AUTH_CACHE_ENTRIES_MAX: usize = 4096;
pub const PASSWORD_BYTES_MIN: usize = 8;
const USER_NAME_BYTES_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub role: Role,
    pub disabled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    pub name: String,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub user: String,
    pub role: Role,
    pub created_ns: i64,
    pub expires_ns: i64,
    pub label: String,
}

#[derive(Debug, Clone, Default)]
pub struct NewUser {
    pub name: String,
    pub password: String,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
    pub role: Option<Role>,
}

#[derive(Debug, Clone, Default)]
pub struct UserUpdate {
    pub password: Option<String>,
    pub groups: Option<Vec<u32>>,
    pub role: Option<Role>,
    pub disabled: Option<bool>,
}

fn user_key(name: &str) -> Vec<u8> {
    format!("u/{name}").into_bytes()
}
fn uid_key(uid: u32) -> Vec<u8> {
    let mut k = b"uid/".to_vec();
    k.extend_from_slice(&uid.to_be_bytes());
    k
}
fn group_key(name: &str) -> Vec<u8> {
    format!("g/{name}").into_bytes()
}
fn gid_key(gid: u32) -> Vec<u8> {
    let mut k = b"gid/".to_vec();
    k.extend_from_slice(&gid.to_be_bytes());
    k
}
fn s3_key(access: &str) -> Vec<u8> {
    format!("s3/{access}").into_bytes()
}

/// An S3 access key. The secret is kept as given: SigV4 verification needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3KeyInfo {
    pub access_key: String,
    pub user: String,
    pub created_ns: i64,
}

fn ssh_key_key(user: &str, fingerprint: &str) -> Vec<u8> {
    format!("ssh/{user}/{fingerprint}").into_bytes()
}

/// Longest OpenSSH public key line accepted (RSA 16384-bit keys fit).
const SSH_KEY_LINE_BYTES_MAX: usize = 8192;

/// NT hash of a user's password, for SMB NTLMv2 (DESIGN.md §3.4). Kept beside the user record
/// so users created before it existed simply have none until their password is set again.
fn nt_hash_key(name: &str) -> Vec<u8> {
    format!("nt/{name}").into_bytes()
}

/// The NT hash of a password: MD4 of its UTF-16LE encoding (MS-NLMP 3.3.1).
pub(crate) fn nt_hash(password: &str) -> [u8; 16] {
    use md4::Digest as _;
    let utf16: Vec<u8> = password.encode_utf16().flat_map(u16::to_le_bytes).collect();
    md4::Md4::digest(&utf16).into()
}

fn token_key(id: &str) -> Vec<u8> {
    format!("t/{id}").into_bytes()
}

fn validate_user_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= USER_NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "name must be 1-{USER_NAME_BYTES_MAX} characters of a-z, A-Z, 0-9, '.', '_', '-'"
        )))
    }
}

fn require(caller: &Caller, role: Role) -> Result<()> {
    if caller.role >= role { Ok(()) } else { Err(Error::PermissionDenied) }
}

impl Engine {
    fn hasher(&self) -> argon2::Argon2<'static> {
        let params = argon2::Params::new(self.cfg.argon2_memory_kib.max(8), 2, 1, None)
            .expect("valid argon2 parameters");
        argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
    }

    fn hash_password(&self, password: &str) -> Result<String> {
        if password.len() < PASSWORD_BYTES_MIN {
            return Err(Error::InvalidArgument(format!("password must be at least {PASSWORD_BYTES_MIN} bytes")));
        }
        let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>()).map_err(|e| Error::InvalidArgument(format!("salt: {e}")))?;
        self.hasher()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| Error::InvalidArgument(format!("hash password: {e}")))
    }

    fn get_user_rec(&self, name: &str) -> Result<Option<UserRec>> {
        match self.db.get_cf(self.cf(CF_IDENTITY), user_key(name))? {
            Some(v) => Ok(Some(UserRec::decode(&v)?)),
            None => Ok(None),
        }
    }

    fn user_by_uid(&self, uid: u32) -> Result<Option<UserRec>> {
        match self.db.get_cf(self.cf(CF_IDENTITY), uid_key(uid))? {
            Some(name) => self.get_user_rec(&String::from_utf8_lossy(&name)),
            None => Ok(None),
        }
    }

    /// The name of the account with `uid`, for listings that show owners by name (`ls -l`
    /// over SFTP, where OpenSSH's server shows the names of /etc/passwd): `None` when no
    /// account has it. Any caller may ask, as any local user may read /etc/passwd.
    pub fn user_name(&self, uid: u32) -> Result<Option<String>> {
        Ok(self.db.get_cf(self.cf(CF_IDENTITY), uid_key(uid))?.map(|n| String::from_utf8_lossy(&n).into_owned()))
    }

    /// The name of the group with `gid`, as [`user_name`](Self::user_name).
    pub fn group_name(&self, gid: u32) -> Result<Option<String>> {
        Ok(self.db.get_cf(self.cf(CF_IDENTITY), gid_key(gid))?.map(|n| String::from_utf8_lossy(&n).into_owned()))
    }

    fn caller_of(rec: &UserRec, role: Role) -> Caller {
        Caller { user: rec.name.clone(), uid: rec.uid, gid: rec.gid, groups: rec.groups.clone(), role }
    }

    fn write_identity(&self, batch: WriteBatch) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo)?;
        self.auth_cache.lock().clear();
        Ok(())
    }

    /// Creates `admin` (uid 0) on a fresh node, with the configured password or a random one.
    pub(crate) fn ensure_admin(&self) -> Result<()> {
        if self.get_user_rec("admin")?.is_some() {
            return Ok(());
        }
        let password = match &self.cfg.admin_password {
            Some(p) => p.clone(),
            None => {
                let bytes: [u8; 12] = rand::random();
                hex::encode(bytes)
            }
        };
        let _g = self.mutate.lock();
        let mut batch = WriteBatch::default();
        let cf = self.cf(CF_IDENTITY);
        let g = GroupRec { name: "admin".into(), gid: 0 };
        batch.put_cf(cf, group_key("admin"), g.encode());
        batch.put_cf(cf, gid_key(0), b"admin");
        let u = UserRec {
            name: "admin".into(),
            uid: 0,
            gid: 0,
            groups: vec![],
            role: Role::Admin,
            password_hash: self.hash_password(&password)?,
            disabled: false,
        };
        batch.put_cf(cf, user_key("admin"), u.encode());
        batch.put_cf(cf, uid_key(0), b"admin");
        batch.put_cf(cf, nt_hash_key("admin"), nt_hash(&password));
        self.write_identity(batch)?;
        Ok(())
    }

    /// Verifies a user name and password.
    pub fn authenticate_password(&self, name: &str, password: &str) -> Result<Caller> {
        let digest: [u8; 32] = blake3::hash(password.as_bytes()).into();
        let key = (name.to_string(), digest);
        if let Some((c, at)) = self.auth_cache.lock().get(&key) {
            if at.elapsed() < AUTH_CACHE_TTL {
                return Ok(c.clone());
            }
        }
        let rec = self.get_user_rec(name)?.ok_or(Error::Unauthenticated)?;
        if rec.disabled {
            return Err(Error::Unauthenticated);
        }
        let parsed = PasswordHash::new(&rec.password_hash).map_err(|_| Error::Corrupt("password hash".into()))?;
        self.hasher().verify_password(password.as_bytes(), &parsed).map_err(|_| Error::Unauthenticated)?;
        let caller = Self::caller_of(&rec, rec.role);
        let mut cache = self.auth_cache.lock();
        if cache.len() >= AUTH_CACHE_ENTRIES_MAX {
            cache.clear();
        }
        cache.insert(key, (caller.clone(), Instant::now()));
        Ok(caller)
    }

    /// Verifies an API token (`aqf_<id>_<secret>`).
    pub fn authenticate_token(&self, token: &str) -> Result<Caller> {
        let rest = token.strip_prefix("aqf_").ok_or(Error::Unauthenticated)?;
        let (id, secret) = rest.split_once('_').ok_or(Error::Unauthenticated)?;
        let v = self.db.get_cf(self.cf(CF_IDENTITY), token_key(id))?.ok_or(Error::Unauthenticated)?;
        if v.len() < 32 {
            return Err(Error::Corrupt("token record".into()));
        }
        let want: [u8; 32] = v[..32].try_into().expect("32");
        // blake3::Hash compares in constant time.
        if blake3::hash(secret.as_bytes()) != blake3::Hash::from(want) {
            return Err(Error::Unauthenticated);
        }
        let rec = TokenRec::decode(&v[32..])?;
        if rec.expires_ns != 0 && rec.expires_ns <= self.now() {
            return Err(Error::Unauthenticated);
        }
        let user = self.user_by_uid(rec.uid)?.ok_or(Error::Unauthenticated)?;
        if user.disabled {
            return Err(Error::Unauthenticated);
        }
        Ok(Self::caller_of(&user, rec.role.min(user.role)))
    }

    fn info(rec: &UserRec) -> UserInfo {
        UserInfo { name: rec.name.clone(), uid: rec.uid, gid: rec.gid, groups: rec.groups.clone(), role: rec.role, disabled: rec.disabled }
    }

    pub fn list_users(&self, caller: &Caller) -> Result<Vec<UserInfo>> {
        require(caller, Role::ReadOnly)?;
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_IDENTITY), IteratorMode::From(b"u/", Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(b"u/") {
                break;
            }
            out.push(Self::info(&UserRec::decode(&v)?));
        }
        Ok(out)
    }

    pub fn get_user(&self, caller: &Caller, name: &str) -> Result<UserInfo> {
        if caller.user != name {
            require(caller, Role::ReadOnly)?;
        }
        self.get_user_rec(name)?.map(|r| Self::info(&r)).ok_or(Error::NotFound)
    }

    fn free_id(&self, key: fn(u32) -> Vec<u8>) -> Result<u32> {
        let mut id = ID_AUTO_FIRST;
        while self.db.get_cf(self.cf(CF_IDENTITY), key(id))?.is_some() {
            id += 1;
        }
        Ok(id)
    }

    /// Creates a user. Without a gid, a private group of the same name is created with
    /// gid = uid, as Debian does.
    pub fn create_user(&self, caller: &Caller, new: NewUser) -> Result<UserInfo> {
        require(caller, Role::Admin)?;
        validate_user_name(&new.name)?;
        let hash = self.hash_password(&new.password)?;
        let _g = self.mutate.lock();
        if self.get_user_rec(&new.name)?.is_some() {
            return Err(Error::Exists);
        }
        let uid = match new.uid {
            Some(u) => {
                if self.db.get_cf(self.cf(CF_IDENTITY), uid_key(u))?.is_some() {
                    return Err(Error::InvalidArgument(format!("uid {u} is taken")));
                }
                u
            }
            None => self.free_id(uid_key)?.max(self.free_id(gid_key)?),
        };
        let cf = self.cf(CF_IDENTITY);
        let mut batch = WriteBatch::default();
        let gid = match new.gid {
            Some(g) => {
                if self.db.get_cf(cf, gid_key(g))?.is_none() {
                    return Err(Error::InvalidArgument(format!("group {g} does not exist")));
                }
                g
            }
            None => {
                if self.db.get_cf(cf, group_key(&new.name))?.is_some() || self.db.get_cf(cf, gid_key(uid))?.is_some() {
                    return Err(Error::InvalidArgument(format!("a group named {} or with gid {uid} exists; give a gid", new.name)));
                }
                batch.put_cf(cf, group_key(&new.name), GroupRec { name: new.name.clone(), gid: uid }.encode());
                batch.put_cf(cf, gid_key(uid), new.name.as_bytes());
                uid
            }
        };
        for g in &new.groups {
            if self.db.get_cf(cf, gid_key(*g))?.is_none() {
                return Err(Error::InvalidArgument(format!("group {g} does not exist")));
            }
        }
        let rec = UserRec {
            name: new.name.clone(),
            uid,
            gid,
            groups: new.groups,
            role: new.role.unwrap_or(Role::User),
            password_hash: hash,
            disabled: false,
        };
        batch.put_cf(cf, user_key(&rec.name), rec.encode());
        batch.put_cf(cf, uid_key(uid), rec.name.as_bytes());
        batch.put_cf(cf, nt_hash_key(&rec.name), nt_hash(&new.password));
        self.write_identity(batch)?;
        Ok(Self::info(&rec))
    }

    /// Changes a user. A user may change their own password; everything else needs admin.
    pub fn update_user(&self, caller: &Caller, name: &str, upd: UserUpdate) -> Result<UserInfo> {
        let self_service = caller.user == name && upd.groups.is_none() && upd.role.is_none() && upd.disabled.is_none();
        if !self_service {
            require(caller, Role::Admin)?;
        }
        let hash = match &upd.password {
            Some(p) => Some(self.hash_password(p)?),
            None => None,
        };
        let _g = self.mutate.lock();
        let mut rec = self.get_user_rec(name)?.ok_or(Error::NotFound)?;
        if rec.uid == 0 && (upd.disabled == Some(true) || upd.role.is_some_and(|r| r != Role::Admin)) {
            return Err(Error::InvalidArgument("the admin user cannot be disabled or demoted".into()));
        }
        if let Some(h) = hash {
            rec.password_hash = h;
        }
        if let Some(gs) = upd.groups {
            for g in &gs {
                if self.db.get_cf(self.cf(CF_IDENTITY), gid_key(*g))?.is_none() {
                    return Err(Error::InvalidArgument(format!("group {g} does not exist")));
                }
            }
            rec.groups = gs;
        }
        if let Some(r) = upd.role {
            rec.role = r;
        }
        if let Some(d) = upd.disabled {
            rec.disabled = d;
        }
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_IDENTITY), user_key(name), rec.encode());
        if let Some(p) = &upd.password {
            batch.put_cf(self.cf(CF_IDENTITY), nt_hash_key(name), nt_hash(p));
        }
        self.write_identity(batch)?;
        Ok(Self::info(&rec))
    }

    pub fn delete_user(&self, caller: &Caller, name: &str) -> Result<()> {
        require(caller, Role::Admin)?;
        let _g = self.mutate.lock();
        let rec = self.get_user_rec(name)?.ok_or(Error::NotFound)?;
        if rec.uid == 0 {
            return Err(Error::InvalidArgument("the admin user cannot be deleted".into()));
        }
        let cf = self.cf(CF_IDENTITY);
        let mut batch = WriteBatch::default();
        batch.delete_cf(cf, user_key(name));
        batch.delete_cf(cf, uid_key(rec.uid));
        batch.delete_cf(cf, nt_hash_key(name));
        // The user's tokens die with it.
        for kv in self.db.iterator_cf(cf, IteratorMode::From(b"t/", Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(b"t/") {
                break;
            }
            if v.len() > 32 && TokenRec::decode(&v[32..])?.uid == rec.uid {
                batch.delete_cf(cf, k);
            }
        }
        self.write_identity(batch)
    }

    pub fn list_groups(&self, caller: &Caller) -> Result<Vec<GroupInfo>> {
        require(caller, Role::ReadOnly)?;
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_IDENTITY), IteratorMode::From(b"g/", Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(b"g/") {
                break;
            }
            let g = GroupRec::decode(&v)?;
            out.push(GroupInfo { name: g.name, gid: g.gid });
        }
        Ok(out)
    }

    pub fn create_group(&self, caller: &Caller, name: &str, gid: Option<u32>) -> Result<GroupInfo> {
        require(caller, Role::Admin)?;
        validate_user_name(name)?;
        let _g = self.mutate.lock();
        let cf = self.cf(CF_IDENTITY);
        if self.db.get_cf(cf, group_key(name))?.is_some() {
            return Err(Error::Exists);
        }
        let gid = match gid {
            Some(g) => {
                if self.db.get_cf(cf, gid_key(g))?.is_some() {
                    return Err(Error::InvalidArgument(format!("gid {g} is taken")));
                }
                g
            }
            None => self.free_id(gid_key)?,
        };
        let mut batch = WriteBatch::default();
        batch.put_cf(cf, group_key(name), GroupRec { name: name.into(), gid }.encode());
        batch.put_cf(cf, gid_key(gid), name.as_bytes());
        self.write_identity(batch)?;
        Ok(GroupInfo { name: name.into(), gid })
    }

    pub fn delete_group(&self, caller: &Caller, name: &str) -> Result<()> {
        require(caller, Role::Admin)?;
        let _g = self.mutate.lock();
        let cf = self.cf(CF_IDENTITY);
        let g = GroupRec::decode(&self.db.get_cf(cf, group_key(name))?.ok_or(Error::NotFound)?)?;
        if g.gid == 0 {
            return Err(Error::InvalidArgument("the admin group cannot be deleted".into()));
        }
        for u in self.list_users(&Caller::system())? {
            if u.gid == g.gid {
                return Err(Error::Busy(format!("group {name} is the primary group of {}", u.name)));
            }
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(cf, group_key(name));
        batch.delete_cf(cf, gid_key(g.gid));
        self.write_identity(batch)
    }

    /// Issues a token for `user` (admins may issue for anybody; others for themselves) with
    /// a role no higher than the user's. Returns the secret once; only its hash is kept.
    pub fn create_token(&self, caller: &Caller, user: Option<&str>, role: Option<Role>, ttl_secs: Option<u64>, label: &str) -> Result<(String, TokenInfo)> {
        let user = user.unwrap_or(&caller.user).to_string();
        if user != caller.user {
            require(caller, Role::Admin)?;
        }
        let urec = self.get_user_rec(&user)?.ok_or(Error::NotFound)?;
        let role = role.unwrap_or(urec.role);
        if role > urec.role {
            return Err(Error::InvalidArgument(format!("{user} cannot hold a {} token", role.as_str())));
        }
        if label.len() > 256 {
            return Err(Error::InvalidArgument("label longer than 256 bytes".into()));
        }
        let id = hex::encode(rand::random::<[u8; 8]>());
        let secret = hex::encode(rand::random::<[u8; 32]>());
        let now = self.now();
        let rec = TokenRec {
            id: id.clone(),
            uid: urec.uid,
            role,
            created_ns: now,
            expires_ns: ttl_secs.map(|t| now + (t.min(10 * 365 * 86400) as i64) * 1_000_000_000).unwrap_or(0),
            label: label.to_string(),
        };
        let mut v = blake3::hash(secret.as_bytes()).as_bytes().to_vec();
        v.extend_from_slice(&rec.encode());
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_IDENTITY), token_key(&id), v);
        self.write_identity(batch)?;
        let info = TokenInfo { id: id.clone(), user, role, created_ns: now, expires_ns: rec.expires_ns, label: rec.label };
        Ok((format!("aqf_{id}_{secret}"), info))
    }

    pub fn list_tokens(&self, caller: &Caller) -> Result<Vec<TokenInfo>> {
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_IDENTITY), IteratorMode::From(b"t/", Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(b"t/") {
                break;
            }
            if v.len() < 32 {
                return Err(Error::Corrupt("token record".into()));
            }
            let rec = TokenRec::decode(&v[32..])?;
            if rec.uid != caller.uid && caller.role < Role::ReadOnly {
                continue;
            }
            let user = self.user_by_uid(rec.uid)?.map(|u| u.name).unwrap_or_default();
            out.push(TokenInfo { id: rec.id, user, role: rec.role, created_ns: rec.created_ns, expires_ns: rec.expires_ns, label: rec.label });
        }
        Ok(out)
    }

    pub fn revoke_token(&self, caller: &Caller, id: &str) -> Result<()> {
        let cf = self.cf(CF_IDENTITY);
        let v = self.db.get_cf(cf, token_key(id))?.ok_or(Error::NotFound)?;
        if v.len() < 32 {
            return Err(Error::Corrupt("token record".into()));
        }
        let rec = TokenRec::decode(&v[32..])?;
        if rec.uid != caller.uid {
            require(caller, Role::Admin)?;
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(cf, token_key(id));
        self.write_identity(batch)
    }

    /// Issues an S3 access key pair for `user` (admins for anybody, users for themselves).
    /// With `pair` the given access key and secret are stored (the embedded default takes
    /// them from the environment); otherwise both are generated. Returns (access, secret).
    pub fn create_s3_key(&self, caller: &Caller, user: &str, pair: Option<(&str, &str)>) -> Result<(String, String)> {
        if user != caller.user {
            require(caller, Role::Admin)?;
        }
        let urec = self.get_user_rec(user)?.ok_or(Error::NotFound)?;
        let (access, secret) = match pair {
            Some((a, s)) => (a.to_string(), s.to_string()),
            None => (
                format!("AQ{}", hex::encode_upper(rand::random::<[u8; 9]>())),
                hex::encode(rand::random::<[u8; 20]>()),
            ),
        };
        let ok_access = (3..=128).contains(&access.len()) && access.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !ok_access {
            return Err(Error::InvalidArgument("access key must be 3-128 characters of A-Z, a-z, 0-9, '-', '_', '.'".into()));
        }
        if secret.len() < 8 || secret.len() > 128 || !secret.is_ascii() {
            return Err(Error::InvalidArgument("secret must be 8-128 ASCII characters".into()));
        }
        let _g = self.mutate.lock();
        if self.db.get_cf(self.cf(CF_IDENTITY), s3_key(&access))?.is_some() {
            return Err(Error::Exists);
        }
        let mut e = crate::records::Enc::new(1);
        e.u32(urec.uid).bytes(secret.as_bytes()).i64(self.now());
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_IDENTITY), s3_key(&access), e.finish());
        self.write_identity(batch)?;
        Ok((access, secret))
    }

    /// The secret and the caller an S3 access key stands for (SigV4 verification).
    pub fn s3_credentials(&self, access: &str) -> Result<(String, Caller)> {
        let v = self.db.get_cf(self.cf(CF_IDENTITY), s3_key(access))?.ok_or(Error::Unauthenticated)?;
        let mut d = crate::records::Dec::new(&v, "s3 key", 1)?;
        let uid = d.u32()?;
        let secret = crate::records::utf8(d.bytes()?, "s3 secret")?;
        let user = self.user_by_uid(uid)?.ok_or(Error::Unauthenticated)?;
        if user.disabled {
            return Err(Error::Unauthenticated);
        }
        Ok((secret, Self::caller_of(&user, user.role)))
    }

    pub fn list_s3_keys(&self, caller: &Caller) -> Result<Vec<S3KeyInfo>> {
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_IDENTITY), IteratorMode::From(b"s3/", Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(b"s3/") {
                break;
            }
            let mut d = crate::records::Dec::new(&v, "s3 key", 1)?;
            let uid = d.u32()?;
            let _secret = d.bytes()?;
            let created_ns = d.i64()?;
            if uid != caller.uid && caller.role < Role::ReadOnly {
                continue;
            }
            let user = self.user_by_uid(uid)?.map(|u| u.name).unwrap_or_default();
            out.push(S3KeyInfo { access_key: String::from_utf8_lossy(&k[3..]).into_owned(), user, created_ns });
        }
        Ok(out)
    }

    pub fn delete_s3_key(&self, caller: &Caller, access: &str) -> Result<()> {
        let (_, owner) = self.s3_credentials(access).map_err(|_| Error::NotFound)?;
        if owner.uid != caller.uid {
            require(caller, Role::Admin)?;
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.cf(CF_IDENTITY), s3_key(access));
        self.write_identity(batch)
    }

    /// Adds an OpenSSH public key line (`ssh-ed25519 AAAA... comment`) to `user` for SFTP
    /// login. Returns its id (hex BLAKE3 of the key blob). The protocol verifies the format
    /// further; the engine checks the shape and stores it.
    pub fn add_ssh_key(&self, caller: &Caller, user: &str, line: &str) -> Result<String> {
        if user != caller.user {
            require(caller, Role::Admin)?;
        }
        self.get_user_rec(user)?.ok_or(Error::NotFound)?;
        let line = line.trim();
        let mut parts = line.split_whitespace();
        let (Some(algo), Some(blob)) = (parts.next(), parts.next()) else {
            return Err(Error::InvalidArgument("an SSH public key line is 'ALGORITHM BASE64 [comment]'".into()));
        };
        let algo_ok = algo.starts_with("ssh-") || algo.starts_with("ecdsa-") || algo.starts_with("sk-");
        let blob_ok = blob.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)) && blob.len() >= 16;
        if !algo_ok || !blob_ok || line.len() > SSH_KEY_LINE_BYTES_MAX || line.contains('\0') {
            return Err(Error::InvalidArgument("not an OpenSSH public key line".into()));
        }
        let id = blake3::hash(blob.as_bytes()).to_hex()[..16].to_string();
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_IDENTITY), ssh_key_key(user, &id), line.as_bytes());
        self.write_identity(batch)?;
        Ok(id)
    }

    /// `user`'s SSH public keys as (id, OpenSSH line). No caller: the SSH server asks this
    /// before anybody is authenticated.
    pub fn ssh_keys_of(&self, user: &str) -> Result<Vec<(String, String)>> {
        let prefix = format!("ssh/{user}/").into_bytes();
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_IDENTITY), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(&prefix) {
                break;
            }
            out.push((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), String::from_utf8_lossy(&v).into_owned()));
        }
        Ok(out)
    }

    pub fn delete_ssh_key(&self, caller: &Caller, user: &str, id: &str) -> Result<()> {
        if user != caller.user {
            require(caller, Role::Admin)?;
        }
        if self.db.get_cf(self.cf(CF_IDENTITY), ssh_key_key(user, id))?.is_none() {
            return Err(Error::NotFound);
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.cf(CF_IDENTITY), ssh_key_key(user, id));
        self.write_identity(batch)
    }

    /// The caller for a user who proved possession of one of their SSH keys.
    pub fn caller_for_user(&self, user: &str) -> Result<Caller> {
        let rec = self.get_user_rec(user)?.ok_or(Error::Unauthenticated)?;
        if rec.disabled {
            return Err(Error::Unauthenticated);
        }
        Ok(Self::caller_of(&rec, rec.role))
    }

    /// NT hashes of every enabled user that has one (SMB logins). Users whose password was set
    /// before NT hashes were kept have none and cannot log in over SMB until it is set again.
    pub fn nt_hashes(&self) -> Result<Vec<(String, [u8; 16])>> {
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_IDENTITY), IteratorMode::From(b"nt/", Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(b"nt/") {
                break;
            }
            let name = String::from_utf8_lossy(&k[3..]).into_owned();
            let hash: [u8; 16] = v[..].try_into().map_err(|_| Error::Corrupt("NT hash".into()))?;
            if self.get_user_rec(&name)?.is_some_and(|u| !u.disabled) {
                out.push((name, hash));
            }
        }
        Ok(out)
    }

    /// The caller for a uid (NFS AUTH_SYS); unknown uids act with only that uid and gid.
    pub fn caller_for_uid(&self, uid: u32, gid: u32, groups: &[u32]) -> Result<Caller> {
        Ok(match self.user_by_uid(uid)? {
            Some(u) if !u.disabled => Caller { user: u.name, uid, gid, groups: groups.to_vec(), role: Role::User },
            _ => Caller { user: format!("uid:{uid}"), uid, gid, groups: groups.to_vec(), role: Role::User },
        })
    }
}

#[cfg(test)]
mod nt_hash_tests {
    #[test]
    fn nt_hash_matches_known_vectors() {
        // MS-NLMP 4.2.2.1.2 ("Password") and the widely published hash of "password".
        assert_eq!(hex::encode(super::nt_hash("Password")), "a4f49c406510bdcab6824ee7c30fd852");
        assert_eq!(hex::encode(super::nt_hash("password")), "8846f7eaee8fb117ad06bdd830b7586c");
    }
}
