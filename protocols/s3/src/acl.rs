//! S3 access control lists beyond what a file's mode can say: grants to other users, to
//! everyone (`AllUsers`) and to every signed-in user (`AuthenticatedUsers`).
//!
//! A bucket or object whose ACL is what the mode view shows (owner `FULL_CONTROL`, and
//! `AllUsers` `READ` for the public-read mark) stores nothing: the canned ACLs `private` and
//! `public-read` stay a mode and a mark, as before. Any other ACL is stored whole in the
//! `aquifer.s3.acl` xattr (format in [`Acl::encode`]) and is then authoritative for S3
//! requests to that bucket or object (see `auth.rs`): a grant lets its grantee act with the
//! owner's permissions, and a requester without a matching grant is refused, the owner
//! included, except that the owner may always read and change the ACL itself (as in S3).
//!
//! Requests are checked here before anything is stored: an unknown user id is
//! `InvalidArgument`, an e-mail grantee `UnresolvableGrantByEmailAddress` (Aquifer users
//! have no e-mail addresses), a grant without grantee or with an unknown permission
//! `MalformedACLError`.

use s3s::dto::{AccessControlPolicy, Grant, Grantee, Owner, Permission, Type};
use s3s::{S3Error, S3ErrorCode, S3Result};
use storage_engine::{Caller, Engine};

pub(crate) const ALL_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
pub(crate) const AUTHENTICATED_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";
/// Most grants in one ACL (as S3).
pub const ACL_GRANTS_MAX: usize = 100;

/// Who a grant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    /// A user, by uid (the canonical id Aquifer reports in `Owner/ID`).
    User(u32),
    /// Everyone, anonymous clients included.
    AllUsers,
    /// Every signed-in user.
    AuthenticatedUsers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Perm {
    Read,
    Write,
    ReadAcp,
    WriteAcp,
    FullControl,
}

impl Perm {
    fn parse(s: &str) -> Option<Perm> {
        Some(match s {
            Permission::READ => Perm::Read,
            Permission::WRITE => Perm::Write,
            Permission::READ_ACP => Perm::ReadAcp,
            Permission::WRITE_ACP => Perm::WriteAcp,
            Permission::FULL_CONTROL => Perm::FullControl,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Perm::Read => Permission::READ,
            Perm::Write => Permission::WRITE,
            Perm::ReadAcp => Permission::READ_ACP,
            Perm::WriteAcp => Permission::WRITE_ACP,
            Perm::FullControl => Permission::FULL_CONTROL,
        }
    }

    /// Whether holding `self` gives `need`.
    pub fn covers(self, need: Perm) -> bool {
        self == Perm::FullControl || self == need
    }
}

/// An owner and its grants, in the order they were given (S3 gives grants no order; the
/// order is kept so that an ACL reads back as it was put).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acl {
    pub owner: u32,
    pub grants: Vec<(Who, Perm)>,
}

impl Acl {
    /// Version 1: a first line `1 <owner uid>`, then one line per grant: `u:<uid>`, `all` or
    /// `auth`, a space, the permission as S3 names it.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("1 {}\n", self.owner);
        for (who, perm) in &self.grants {
            match who {
                Who::User(uid) => s.push_str(&format!("u:{uid}")),
                Who::AllUsers => s.push_str("all"),
                Who::AuthenticatedUsers => s.push_str("auth"),
            }
            s.push(' ');
            s.push_str(perm.as_str());
            s.push('\n');
        }
        s.into_bytes()
    }

    /// `None` for anything `encode` would not write.
    pub fn decode(b: &[u8]) -> Option<Acl> {
        let s = std::str::from_utf8(b).ok()?;
        let mut lines = s.lines();
        let owner = lines.next()?.strip_prefix("1 ")?.parse().ok()?;
        let mut grants = Vec::new();
        for line in lines {
            let (who, perm) = line.split_once(' ')?;
            let who = match who {
                "all" => Who::AllUsers,
                "auth" => Who::AuthenticatedUsers,
                _ => Who::User(who.strip_prefix("u:")?.parse().ok()?),
            };
            grants.push((who, Perm::parse(perm)?));
        }
        Some(Acl { owner, grants })
    }

    /// A canned ACL, with grants to groups first and the owner's last (as Ceph RGW lists
    /// them). `bucket_owner` matters for `bucket-owner-*` only. `None` for a name not
    /// supported (`aws-exec-read`, `log-delivery-write`).
    pub fn canned(name: &str, owner: u32, bucket_owner: u32) -> Option<Acl> {
        let full = (Who::User(owner), Perm::FullControl);
        let grants = match name {
            "private" => vec![full],
            "public-read" => vec![(Who::AllUsers, Perm::Read), full],
            "public-read-write" => vec![(Who::AllUsers, Perm::Read), (Who::AllUsers, Perm::Write), full],
            "authenticated-read" => vec![(Who::AuthenticatedUsers, Perm::Read), full],
            "bucket-owner-read" if bucket_owner != owner => vec![full, (Who::User(bucket_owner), Perm::Read)],
            "bucket-owner-full-control" if bucket_owner != owner => vec![full, (Who::User(bucket_owner), Perm::FullControl)],
            "bucket-owner-read" | "bucket-owner-full-control" => vec![full],
            _ => return None,
        };
        Some(Acl { owner, grants })
    }

    /// Whether `requester` (`None`: anonymous) holds `need`. The owner always holds
    /// `READ_ACP` and `WRITE_ACP`, so that an ACL can never lock its owner out of itself.
    pub fn allows(&self, requester: Option<u32>, need: Perm) -> bool {
        if requester == Some(self.owner) && matches!(need, Perm::ReadAcp | Perm::WriteAcp) {
            return true;
        }
        self.grants.iter().any(|(who, perm)| {
            perm.covers(need)
                && match who {
                    Who::AllUsers => true,
                    Who::AuthenticatedUsers => requester.is_some(),
                    Who::User(uid) => requester == Some(*uid),
                }
        })
    }

    /// Whether anonymous clients may read (the public-read mark goes with this).
    pub fn everyone_reads(&self) -> bool {
        self.grants.iter().any(|(w, p)| *w == Who::AllUsers && p.covers(Perm::Read))
    }

    /// Whether users other than the owner may read through a group grant (the object's
    /// mode then lets others read).
    pub fn group_reads(&self) -> bool {
        self.grants.iter().any(|(w, p)| matches!(w, Who::AllUsers | Who::AuthenticatedUsers) && p.covers(Perm::Read))
    }

    /// `Some(public)` when the mode view of a bucket or object owned by `file_uid` says
    /// exactly this ACL (owner full control, and everyone's read when `public`): it is then
    /// kept as mode and mark, and nothing is stored.
    pub fn as_mode_view(&self, file_uid: u32) -> Option<bool> {
        if self.owner != file_uid {
            return None;
        }
        let mut owner_full = false;
        let mut public = false;
        for g in &self.grants {
            match g {
                (Who::User(u), Perm::FullControl) if *u == file_uid && !owner_full => owner_full = true,
                (Who::AllUsers, Perm::Read) if !public => public = true,
                _ => return None,
            }
        }
        owner_full.then_some(public)
    }

    /// The mode view: what an ACL that is not stored says.
    pub fn mode_view(owner: u32, public: bool) -> Acl {
        let mut grants = Vec::new();
        if public {
            grants.push((Who::AllUsers, Perm::Read));
        }
        grants.push((Who::User(owner), Perm::FullControl));
        Acl { owner, grants }
    }

    /// The grants as S3 lists them, users named by `name_of`.
    pub fn to_grants(&self, name_of: impl Fn(u32) -> String) -> Vec<Grant> {
        self.grants
            .iter()
            .map(|(who, perm)| {
                let grantee = match who {
                    Who::User(uid) => Grantee {
                        type_: Type::from_static(Type::CANONICAL_USER),
                        id: Some(uid.to_string()),
                        display_name: Some(name_of(*uid)),
                        email_address: None,
                        uri: None,
                    },
                    Who::AllUsers | Who::AuthenticatedUsers => Grantee {
                        type_: Type::from_static(Type::GROUP),
                        uri: Some(if *who == Who::AllUsers { ALL_USERS_URI } else { AUTHENTICATED_USERS_URI }.into()),
                        id: None,
                        display_name: None,
                        email_address: None,
                    },
                };
                Grant { grantee: Some(grantee), permission: Some(Permission::from_static(perm.as_str())) }
            })
            .collect()
    }
}

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::with_message(code, msg.into())
}

/// The `x-amz-grant-*` headers of a request, in the order their grants are listed:
/// read, write, read-acp, write-acp, full-control.
#[derive(Debug, Default, Clone)]
pub(crate) struct GrantHeaders {
    pub read: Option<String>,
    pub write: Option<String>,
    pub read_acp: Option<String>,
    pub write_acp: Option<String>,
    pub full_control: Option<String>,
}

impl GrantHeaders {
    fn is_empty(&self) -> bool {
        self.read.is_none() && self.write.is_none() && self.read_acp.is_none() && self.write_acp.is_none() && self.full_control.is_none()
    }
}

/// A user id as a grant names it: the uid in decimal, of a user that exists.
fn resolve_user(engine: &Engine, id: &str) -> S3Result<u32> {
    let unknown = || err(S3ErrorCode::InvalidArgument, format!("the grantee id {id:?} is not a user of this server"));
    let uid: u32 = id.trim().parse().map_err(|_| unknown())?;
    let users = engine.list_users(&Caller::system()).map_err(|e| crate::error::map_err(e, crate::error::Missing::Key))?;
    if users.iter().any(|u| u.uid == uid) { Ok(uid) } else { Err(unknown()) }
}

fn resolve_group(uri: &str) -> S3Result<Who> {
    match uri.trim() {
        ALL_USERS_URI => Ok(Who::AllUsers),
        AUTHENTICATED_USERS_URI => Ok(Who::AuthenticatedUsers),
        other => Err(err(S3ErrorCode::InvalidArgument, format!("the grantee group {other:?} is not supported; use AllUsers or AuthenticatedUsers"))),
    }
}

fn unresolvable_email(email: &str) -> S3Error {
    err(S3ErrorCode::UnresolvableGrantByEmailAddress, format!("no user has the e-mail address {email:?} (Aquifer users are named by id)"))
}

/// One `x-amz-grant-*` header value: `id="123", uri="http://...", emailAddress="a@b"`.
fn parse_grant_header(engine: &Engine, value: &str, perm: Perm, out: &mut Vec<(Who, Perm)>) -> S3Result<()> {
    for item in value.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item.split_once('=').ok_or_else(|| err(S3ErrorCode::InvalidArgument, format!("grant header item {item:?} is not key=value")))?;
        let v = v.trim().trim_matches('"');
        let who = match k.trim().to_ascii_lowercase().as_str() {
            "id" => Who::User(resolve_user(engine, v)?),
            "uri" => resolve_group(v)?,
            "emailaddress" => return Err(unresolvable_email(v)),
            other => return Err(err(S3ErrorCode::InvalidArgument, format!("grant header key {other:?} is not id, uri or emailAddress"))),
        };
        out.push((who, perm));
    }
    Ok(())
}

fn from_body(engine: &Engine, policy: &AccessControlPolicy, owner: u32) -> S3Result<Vec<(Who, Perm)>> {
    if let Some(Owner { id: Some(id), .. }) = &policy.owner
        && id.trim() != owner.to_string()
    {
        return Err(err(S3ErrorCode::InvalidArgument, "the ACL's Owner/ID is not the owner; ownership cannot be changed with an ACL"));
    }
    let mut out = Vec::new();
    for g in policy.grants.iter().flatten() {
        let who = g.grantee.as_ref().ok_or_else(|| err(S3ErrorCode::MalformedACLError, "a grant names no grantee"))?;
        let perm = g.permission.as_ref().ok_or_else(|| err(S3ErrorCode::MalformedACLError, "a grant names no permission"))?;
        let perm = Perm::parse(perm.as_str()).ok_or_else(|| err(S3ErrorCode::MalformedACLError, format!("unknown permission {:?}", perm.as_str())))?;
        let who = match (who.type_.as_str(), &who.id, &who.uri, &who.email_address) {
            (Type::CANONICAL_USER, Some(id), _, _) => Who::User(resolve_user(engine, id)?),
            (Type::GROUP, _, Some(uri), _) => resolve_group(uri)?,
            (Type::AMAZON_CUSTOMER_BY_EMAIL, _, _, Some(email)) => return Err(unresolvable_email(email)),
            (t, ..) => return Err(err(S3ErrorCode::MalformedACLError, format!("grantee of type {t:?} lacks its ID, URI or EmailAddress, or the type is unknown"))),
        };
        out.push((who, perm));
    }
    Ok(out)
}

/// The ACL a request asks for, checked whole: a canned name, an `AccessControlPolicy`
/// body, or `x-amz-grant-*` headers (at most one of the three). `None` when the request
/// names no ACL. `owner` is who will own the bucket or object, `bucket_owner` the bucket's
/// owner (for `bucket-owner-*`). Unsupported canned ACLs answer `501 NotImplemented`.
pub(crate) fn requested(
    engine: &Engine,
    canned: Option<&str>,
    body: Option<&AccessControlPolicy>,
    headers: &GrantHeaders,
    owner: u32,
    bucket_owner: u32,
) -> S3Result<Option<Acl>> {
    let given = usize::from(canned.is_some()) + usize::from(body.is_some()) + usize::from(!headers.is_empty());
    if given > 1 {
        return Err(err(S3ErrorCode::InvalidRequest, "give one of a canned ACL (x-amz-acl), x-amz-grant-* headers or an AccessControlPolicy body"));
    }
    let grants = if let Some(name) = canned {
        return match Acl::canned(name, owner, bucket_owner) {
            Some(acl) => Ok(Some(acl)),
            None => Err(err(S3ErrorCode::NotImplemented, format!("the canned ACL {name} is not supported"))),
        };
    } else if let Some(body) = body {
        from_body(engine, body, owner)?
    } else if !headers.is_empty() {
        let mut g = Vec::new();
        for (value, perm) in [
            (&headers.read, Perm::Read),
            (&headers.write, Perm::Write),
            (&headers.read_acp, Perm::ReadAcp),
            (&headers.write_acp, Perm::WriteAcp),
            (&headers.full_control, Perm::FullControl),
        ] {
            if let Some(v) = value {
                parse_grant_header(engine, v, perm, &mut g)?;
            }
        }
        g
    } else {
        return Ok(None);
    };
    if grants.len() > ACL_GRANTS_MAX {
        return Err(err(S3ErrorCode::MalformedACLError, format!("an ACL holds at most {ACL_GRANTS_MAX} grants")));
    }
    Ok(Some(Acl { owner, grants }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acls_round_trip_and_garbage_is_refused() {
        let acl = Acl {
            owner: 1000,
            grants: vec![(Who::AllUsers, Perm::Read), (Who::AuthenticatedUsers, Perm::Write), (Who::User(1001), Perm::ReadAcp), (Who::User(1000), Perm::FullControl)],
        };
        assert_eq!(Acl::decode(&acl.encode()), Some(acl));
        let empty = Acl { owner: 7, grants: vec![] };
        assert_eq!(Acl::decode(&empty.encode()), Some(empty));
        for bad in [&b""[..], b"2 1000\n", b"1 x\n", b"1 1\nu:x READ\n", b"1 1\nall MAYBE\n", b"1 1\nsomeone READ\n", b"1 1\nall\n"] {
            assert_eq!(Acl::decode(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn grants_give_what_s3_says() {
        let acl = Acl { owner: 1, grants: vec![(Who::User(2), Perm::Read), (Who::AuthenticatedUsers, Perm::ReadAcp), (Who::User(3), Perm::FullControl)] };
        assert!(acl.allows(Some(2), Perm::Read));
        assert!(!acl.allows(Some(2), Perm::Write));
        assert!(acl.allows(Some(2), Perm::ReadAcp), "every signed-in user");
        assert!(!acl.allows(None, Perm::ReadAcp), "not anonymous clients");
        assert!(acl.allows(Some(3), Perm::WriteAcp) && acl.allows(Some(3), Perm::Write));
        assert!(!acl.allows(Some(1), Perm::Read), "the owner holds only what is granted");
        assert!(acl.allows(Some(1), Perm::WriteAcp) && acl.allows(Some(1), Perm::ReadAcp), "but always its ACL");
        assert!(!acl.everyone_reads() && !acl.group_reads());
        let prw = Acl::canned("public-read-write", 1, 1).unwrap();
        assert!(prw.allows(None, Perm::Write) && prw.everyone_reads());
        assert_eq!(prw.as_mode_view(1), None);
    }

    #[test]
    fn canned_acls_and_the_mode_view() {
        assert_eq!(Acl::canned("private", 5, 6).unwrap().as_mode_view(5), Some(false));
        assert_eq!(Acl::canned("public-read", 5, 6).unwrap().as_mode_view(5), Some(true));
        assert_eq!(Acl::canned("private", 5, 6).unwrap().as_mode_view(6), None, "another owner is stored");
        assert_eq!(Acl::canned("bucket-owner-read", 5, 6).unwrap().grants, vec![(Who::User(5), Perm::FullControl), (Who::User(6), Perm::Read)]);
        assert_eq!(Acl::canned("bucket-owner-full-control", 5, 5).unwrap().as_mode_view(5), Some(false));
        assert!(Acl::canned("aws-exec-read", 5, 5).is_none());
        assert_eq!(Acl::mode_view(5, true), Acl::canned("public-read", 5, 5).unwrap());
        assert_eq!(Acl { owner: 5, grants: vec![] }.as_mode_view(5), None, "no grants at all is stored");
    }
}
