//! Security descriptors (MS-DTYP 2.4.6) for QUERY_INFO and SET_INFO with
//! SMB2_0_INFO_SECURITY (Aquifer patch), and their mapping to a POSIX owner,
//! group and mode as Samba makes it for a file without stored ACLs.
//!
//! Owners and groups are Samba's "Unix user" and "Unix group" SIDs,
//! `S-1-22-1-<uid>` and `S-1-22-2-<gid>`. The DACL has one ACCESS_ALLOWED
//! ACE each for the owner, the group and Everyone (`S-1-1-0`), carrying the
//! rights of the owner, group and other permission bits. A DACL set by a
//! client maps back to the permission bits only when it has that shape:
//! allow ACEs for those three SIDs and nothing else.
//!
//! Every descriptor parsed here came from the network: each offset, count
//! and size is checked against the buffer, and a malformed one is an error,
//! never a panic.

use crate::access_mask::{
    DELETE, FILE_ALL_ACCESS, FILE_APPEND_DATA, FILE_EXECUTE, FILE_GENERIC_EXECUTE,
    FILE_GENERIC_READ, FILE_GENERIC_WRITE, FILE_READ_DATA, FILE_WRITE_DATA, GENERIC_ALL,
    GENERIC_EXECUTE, GENERIC_READ, GENERIC_WRITE,
};
use crate::backend::{Handle, UnixSecurity, UnixSecurityChange};
use crate::error::SmbError;
use crate::ntstatus;

/// AdditionalInformation bits (MS-DTYP 2.4.7) this server answers.
pub const OWNER_SECURITY_INFORMATION: u32 = 0x0000_0001;
pub const GROUP_SECURITY_INFORMATION: u32 = 0x0000_0002;
pub const DACL_SECURITY_INFORMATION: u32 = 0x0000_0004;
pub const SACL_SECURITY_INFORMATION: u32 = 0x0000_0008;

/// Access to the SACL (MS-DTYP 2.4.3). No open is granted it: the SACL
/// needs a privilege that no session here holds.
pub const ACCESS_SYSTEM_SECURITY: u32 = 0x0100_0000;
pub const WRITE_DAC: u32 = 0x0004_0000;
pub const WRITE_OWNER: u32 = 0x0008_0000;
/// FILE_DELETE_CHILD: a directory's write bit lets its entries be removed.
const FILE_DELETE_CHILD: u32 = 0x0000_0040;

// SECURITY_DESCRIPTOR Control bits (MS-DTYP 2.4.6).
const SE_DACL_PRESENT: u16 = 0x0004;
const SE_SACL_PRESENT: u16 = 0x0010;
const SE_SELF_RELATIVE: u16 = 0x8000;

const SD_HEADER_LEN: usize = 20;
const ACL_HEADER_LEN: usize = 8;
const ACE_HEADER_LEN: usize = 4;
/// ACL_REVISION: ACLs whose ACEs are all of the basic types.
const ACL_REVISION: u8 = 2;
/// At most 15 subauthorities (MS-DTYP 2.4.2).
const SID_SUBAUTHORITIES_MAX: usize = 15;

pub const ACCESS_ALLOWED_ACE_TYPE: u8 = 0;
/// The ACE only passes on to children and does not apply to the object.
pub const INHERIT_ONLY_ACE: u8 = 0x08;

/// Identifier authority of Samba's Unix user and group SIDs.
const UNIX_AUTHORITY: u64 = 22;
const UNIX_USER: u32 = 1;
const UNIX_GROUP: u32 = 2;

/// Why a descriptor from a client cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdError {
    /// Not a well-formed self-relative descriptor.
    Malformed,
    /// Well formed, but the DACL has no POSIX mode that means the same.
    Unmappable,
    /// The owner is not a Unix user SID.
    InvalidOwner,
    /// The group is not a Unix group SID.
    InvalidGroup,
}

impl SdError {
    pub fn status(self) -> u32 {
        match self {
            SdError::Malformed => ntstatus::STATUS_INVALID_PARAMETER,
            SdError::Unmappable => ntstatus::STATUS_NOT_SUPPORTED,
            SdError::InvalidOwner => ntstatus::STATUS_INVALID_OWNER,
            SdError::InvalidGroup => ntstatus::STATUS_INVALID_PRIMARY_GROUP,
        }
    }
}

/// A security identifier (MS-DTYP 2.4.2), revision 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sid {
    /// IdentifierAuthority, 48 bits.
    authority: u64,
    sub_authorities: Vec<u32>,
}

impl Sid {
    fn new(authority: u64, sub_authorities: &[u32]) -> Sid {
        debug_assert!(authority < 1 << 48 && sub_authorities.len() <= SID_SUBAUTHORITIES_MAX);
        Sid {
            authority,
            sub_authorities: sub_authorities.to_vec(),
        }
    }

    /// `S-1-22-1-<uid>`.
    pub fn unix_user(uid: u32) -> Sid {
        Sid::new(UNIX_AUTHORITY, &[UNIX_USER, uid])
    }

    /// `S-1-22-2-<gid>`.
    pub fn unix_group(gid: u32) -> Sid {
        Sid::new(UNIX_AUTHORITY, &[UNIX_GROUP, gid])
    }

    /// `S-1-1-0`.
    pub fn everyone() -> Sid {
        Sid::new(1, &[0])
    }

    fn unix_id(&self, kind: u32) -> Option<u32> {
        match self.sub_authorities[..] {
            [k, id] if self.authority == UNIX_AUTHORITY && k == kind => Some(id),
            _ => None,
        }
    }

    /// The uid of a Unix user SID.
    pub fn unix_uid(&self) -> Option<u32> {
        self.unix_id(UNIX_USER)
    }

    /// The gid of a Unix group SID.
    pub fn unix_gid(&self) -> Option<u32> {
        self.unix_id(UNIX_GROUP)
    }

    fn encoded_len(&self) -> usize {
        8 + 4 * self.sub_authorities.len()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push(1);
        out.push(self.sub_authorities.len() as u8);
        out.extend_from_slice(&self.authority.to_be_bytes()[2..]);
        for s in &self.sub_authorities {
            out.extend_from_slice(&s.to_le_bytes());
        }
    }

    /// The SID at the start of `buf`, and its length.
    pub(crate) fn parse(buf: &[u8]) -> Result<(Sid, usize), SdError> {
        let [revision, count, ..] = *buf else {
            return Err(SdError::Malformed);
        };
        let count = usize::from(count);
        if revision != 1 || count > SID_SUBAUTHORITIES_MAX {
            return Err(SdError::Malformed);
        }
        let len = 8 + 4 * count;
        let bytes = buf.get(..len).ok_or(SdError::Malformed)?;
        let mut authority = [0u8; 8];
        authority[2..].copy_from_slice(&bytes[2..8]);
        let sub_authorities = bytes[8..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok((
            Sid {
                authority: u64::from_be_bytes(authority),
                sub_authorities,
            },
            len,
        ))
    }
}

impl std::fmt::Display for Sid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S-1-{}", self.authority)?;
        for s in &self.sub_authorities {
            write!(f, "-{s}")?;
        }
        Ok(())
    }
}

/// One ACE. Only the basic types (allowed, denied, audit, alarm) carry a
/// mask and a SID in this shape; other types keep `sid: None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ace {
    pub ace_type: u8,
    pub flags: u8,
    pub mask: u32,
    pub sid: Option<Sid>,
}

impl Ace {
    fn allow(mask: u32, sid: Sid) -> Ace {
        Ace {
            ace_type: ACCESS_ALLOWED_ACE_TYPE,
            flags: 0,
            mask,
            sid: Some(sid),
        }
    }
}

/// An ACL (MS-DTYP 2.4.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub revision: u8,
    pub aces: Vec<Ace>,
}

impl Acl {
    fn encoded_len(&self) -> usize {
        ACL_HEADER_LEN
            + self
                .aces
                .iter()
                .map(|a| ACE_HEADER_LEN + 4 + a.sid.as_ref().map_or(0, Sid::encoded_len))
                .sum::<usize>()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.revision);
        out.push(0);
        out.extend_from_slice(&(self.encoded_len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.aces.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        for ace in &self.aces {
            let sid_len = ace.sid.as_ref().map_or(0, Sid::encoded_len);
            out.push(ace.ace_type);
            out.push(ace.flags);
            out.extend_from_slice(&((ACE_HEADER_LEN + 4 + sid_len) as u16).to_le_bytes());
            out.extend_from_slice(&ace.mask.to_le_bytes());
            if let Some(sid) = &ace.sid {
                sid.encode(out);
            }
        }
    }

    /// The ACL at the start of `buf`.
    fn parse(buf: &[u8]) -> Result<Acl, SdError> {
        let header = buf.get(..ACL_HEADER_LEN).ok_or(SdError::Malformed)?;
        let revision = header[0];
        let size = usize::from(u16::from_le_bytes([header[2], header[3]]));
        let count = u16::from_le_bytes([header[4], header[5]]);
        if !(2..=4).contains(&revision) || size < ACL_HEADER_LEN {
            return Err(SdError::Malformed);
        }
        let acl = buf.get(..size).ok_or(SdError::Malformed)?;
        let mut at = ACL_HEADER_LEN;
        // Each ACE takes at least four bytes of the ACL, so `count` cannot
        // make this loop outrun the buffer.
        let mut aces = Vec::new();
        for _ in 0..count {
            let h = acl.get(at..at + ACE_HEADER_LEN).ok_or(SdError::Malformed)?;
            let (ace_type, flags) = (h[0], h[1]);
            let ace_size = usize::from(u16::from_le_bytes([h[2], h[3]]));
            if ace_size < ACE_HEADER_LEN + 4 {
                return Err(SdError::Malformed);
            }
            let body = acl
                .get(at + ACE_HEADER_LEN..at + ace_size)
                .ok_or(SdError::Malformed)?;
            let mask = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
            let sid = if ace_type <= 3 {
                let (sid, _) = Sid::parse(&body[4..])?;
                Some(sid)
            } else {
                None
            };
            aces.push(Ace {
                ace_type,
                flags,
                mask,
                sid,
            });
            at += ace_size;
        }
        Ok(Acl { revision, aces })
    }
}

/// A security descriptor. `dacl_present` with `dacl: None` is a NULL DACL
/// (everyone has every right); without `dacl_present` there is no DACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityDescriptor {
    pub owner: Option<Sid>,
    pub group: Option<Sid>,
    pub dacl_present: bool,
    pub dacl: Option<Acl>,
    pub sacl: Option<Acl>,
}

impl SecurityDescriptor {
    /// Parses a self-relative descriptor.
    pub fn parse(buf: &[u8]) -> Result<SecurityDescriptor, SdError> {
        let header = buf.get(..SD_HEADER_LEN).ok_or(SdError::Malformed)?;
        let u32_at = |at: usize| {
            u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let control = u16::from_le_bytes([header[2], header[3]]);
        if header[0] != 1 || control & SE_SELF_RELATIVE == 0 {
            return Err(SdError::Malformed);
        }
        // An offset of 0 means the part is absent; any other must lie
        // inside the buffer, past the header.
        let part = |offset: u32| -> Result<Option<&[u8]>, SdError> {
            let offset = offset as usize;
            match offset {
                0 => Ok(None),
                o if o < SD_HEADER_LEN || o >= buf.len() => Err(SdError::Malformed),
                o => Ok(Some(&buf[o..])),
            }
        };
        let owner = part(u32_at(4))?
            .map(Sid::parse)
            .transpose()?
            .map(|(s, _)| s);
        let group = part(u32_at(8))?
            .map(Sid::parse)
            .transpose()?
            .map(|(s, _)| s);
        let sacl = match part(u32_at(12))? {
            Some(b) if control & SE_SACL_PRESENT != 0 => Some(Acl::parse(b)?),
            _ => None,
        };
        let dacl_present = control & SE_DACL_PRESENT != 0;
        let dacl = match part(u32_at(16))? {
            Some(b) if dacl_present => Some(Acl::parse(b)?),
            _ => None,
        };
        Ok(SecurityDescriptor {
            owner,
            group,
            dacl_present,
            dacl,
            sacl,
        })
    }

    /// The self-relative form: header, owner, group, DACL.
    pub fn encode(&self) -> Vec<u8> {
        let mut control = SE_SELF_RELATIVE;
        if self.dacl_present {
            control |= SE_DACL_PRESENT;
        }
        if self.sacl.is_some() {
            control |= SE_SACL_PRESENT;
        }
        let mut offset = SD_HEADER_LEN;
        let mut place = |len: Option<usize>| match len {
            Some(len) => {
                let at = offset;
                offset += len;
                at as u32
            }
            None => 0,
        };
        let owner_at = place(self.owner.as_ref().map(Sid::encoded_len));
        let group_at = place(self.group.as_ref().map(Sid::encoded_len));
        let sacl_at = place(self.sacl.as_ref().map(Acl::encoded_len));
        let dacl_at = place(self.dacl.as_ref().map(Acl::encoded_len));
        let mut out = Vec::with_capacity(offset);
        out.push(1);
        out.push(0);
        out.extend_from_slice(&control.to_le_bytes());
        for at in [owner_at, group_at, sacl_at, dacl_at] {
            out.extend_from_slice(&at.to_le_bytes());
        }
        if let Some(s) = &self.owner {
            s.encode(&mut out);
        }
        if let Some(s) = &self.group {
            s.encode(&mut out);
        }
        if let Some(a) = &self.sacl {
            a.encode(&mut out);
        }
        if let Some(a) = &self.dacl {
            a.encode(&mut out);
        }
        debug_assert_eq!(out.len(), offset);
        out
    }
}

/// Rights an ACE grants for the permission bits `rwx` (0 to 7) of one
/// class, as Samba maps them: all three are full control, and write lets
/// the owner delete the file and anyone remove a directory's entries.
fn rights(rwx: u32, owner: bool, directory: bool) -> u32 {
    if rwx == 7 {
        return FILE_ALL_ACCESS;
    }
    let mut mask = 0;
    if rwx & 4 != 0 {
        mask |= FILE_GENERIC_READ;
    }
    if rwx & 2 != 0 {
        mask |= FILE_GENERIC_WRITE;
        if owner {
            mask |= DELETE;
        }
        if directory {
            mask |= FILE_DELETE_CHILD;
        }
    }
    if rwx & 1 != 0 {
        mask |= FILE_GENERIC_EXECUTE;
    }
    mask
}

/// Permission bits (0 to 7) an access mask stands for: reading, writing
/// and executing data, by specific or generic rights.
fn rwx(mask: u32) -> u32 {
    if mask & GENERIC_ALL != 0 {
        return 7;
    }
    let mut bits = 0;
    if mask & (FILE_READ_DATA | GENERIC_READ) != 0 {
        bits |= 4;
    }
    if mask & (FILE_WRITE_DATA | FILE_APPEND_DATA | GENERIC_WRITE) != 0 {
        bits |= 2;
    }
    if mask & (FILE_EXECUTE | GENERIC_EXECUTE) != 0 {
        bits |= 1;
    }
    bits
}

/// The descriptor of a file with POSIX owner, group and mode `sec`, with
/// the parts `wanted` (AdditionalInformation) asks for. The SACL is always
/// left out: no access check here ever grants it.
pub fn describe(sec: &UnixSecurity, wanted: u32) -> SecurityDescriptor {
    let (owner, group) = (Sid::unix_user(sec.uid), Sid::unix_group(sec.gid));
    let dacl = (wanted & DACL_SECURITY_INFORMATION != 0).then(|| {
        let dir = sec.is_directory;
        Acl {
            revision: ACL_REVISION,
            aces: vec![
                Ace::allow(rights((sec.mode >> 6) & 7, true, dir), owner.clone()),
                Ace::allow(rights((sec.mode >> 3) & 7, false, dir), group.clone()),
                Ace::allow(rights(sec.mode & 7, false, dir), Sid::everyone()),
            ],
        }
    });
    SecurityDescriptor {
        owner: (wanted & OWNER_SECURITY_INFORMATION != 0).then_some(owner),
        group: (wanted & GROUP_SECURITY_INFORMATION != 0).then_some(group),
        dacl_present: dacl.is_some(),
        dacl,
        sacl: None,
    }
}

/// Permission bits (0o777) for a DACL on a file owned by `owner` and
/// `group`. A NULL DACL gives everyone every right. An ACE that only passes
/// on to children is left out: the store keeps no inheritable ACLs, and new
/// files get the server's creation modes. Allow ACEs for the same class add
/// up; a class without one gets no rights.
pub fn mode_bits(dacl: Option<&Acl>, owner: &Sid, group: &Sid) -> Result<u32, SdError> {
    let Some(dacl) = dacl else {
        return Ok(0o777);
    };
    let everyone = Sid::everyone();
    let mut mode = 0;
    for ace in &dacl.aces {
        if ace.flags & INHERIT_ONLY_ACE != 0 {
            continue;
        }
        if ace.ace_type != ACCESS_ALLOWED_ACE_TYPE {
            return Err(SdError::Unmappable);
        }
        let sid = ace.sid.as_ref().ok_or(SdError::Unmappable)?;
        let shift = if sid == owner {
            6
        } else if sid == group {
            3
        } else if *sid == everyone {
            0
        } else {
            return Err(SdError::Unmappable);
        };
        mode |= rwx(ace.mask) << shift;
    }
    Ok(mode)
}

/// What a SET_INFO of `sd` with AdditionalInformation `info` changes on a
/// file that now has `current`. Nothing is applied when any part cannot be
/// mapped.
pub fn change_for(
    current: &UnixSecurity,
    sd: &SecurityDescriptor,
    info: u32,
) -> Result<UnixSecurityChange, SdError> {
    let mut change = UnixSecurityChange::default();
    let mut uid = current.uid;
    let mut gid = current.gid;
    if info & OWNER_SECURITY_INFORMATION != 0 {
        if let Some(sid) = &sd.owner {
            uid = sid.unix_uid().ok_or(SdError::InvalidOwner)?;
        }
    }
    if info & GROUP_SECURITY_INFORMATION != 0 {
        if let Some(sid) = &sd.group {
            gid = sid.unix_gid().ok_or(SdError::InvalidGroup)?;
        }
    }
    if info & DACL_SECURITY_INFORMATION != 0 {
        // Without SE_DACL_PRESENT the descriptor has no DACL, which grants
        // every right, as a NULL DACL does.
        let dacl = if sd.dacl_present {
            sd.dacl.as_ref()
        } else {
            None
        };
        let bits = mode_bits(dacl, &Sid::unix_user(uid), &Sid::unix_group(gid))?;
        let mode = (current.mode & !0o777) | bits;
        if mode != current.mode {
            change.mode = Some(mode);
        }
    }
    if uid != current.uid {
        change.uid = Some(uid);
    }
    if gid != current.gid {
        change.gid = Some(gid);
    }
    Ok(change)
}

/// Applies the parts `info` names of `sd` to the file of `handle`: nothing
/// when they change nothing, otherwise one backend call, so nothing is
/// applied when any part is refused. A backend without owners and modes is
/// STATUS_INVALID_DEVICE_REQUEST (MS-FSA 2.1.5.16: the store keeps no
/// security descriptors).
pub async fn apply(handle: &dyn Handle, sd: &SecurityDescriptor, info: u32) -> Result<(), u32> {
    let current = match handle.unix_security().await {
        Ok(current) => current,
        Err(SmbError::NotSupported) => return Err(ntstatus::STATUS_INVALID_DEVICE_REQUEST),
        Err(e) => return Err(e.to_nt_status()),
    };
    let change = change_for(&current, sd, info).map_err(SdError::status)?;
    if change == UnixSecurityChange::default() {
        return Ok(());
    }
    handle
        .set_unix_security(change)
        .await
        .map_err(|e| e.to_nt_status())
}

/// The parts a descriptor sent with a CREATE (SMB2_CREATE_SD_BUFFER) sets:
/// those it has. Without a DACL the new file keeps the mode it was created
/// with.
pub fn parts_present(sd: &SecurityDescriptor) -> u32 {
    let mut info = 0;
    if sd.owner.is_some() {
        info |= OWNER_SECURITY_INFORMATION;
    }
    if sd.group.is_some() {
        info |= GROUP_SECURITY_INFORMATION;
    }
    if sd.dacl_present {
        info |= DACL_SECURITY_INFORMATION;
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACCESS_DENIED_ACE_TYPE: u8 = 1;
    const ALL: u32 =
        OWNER_SECURITY_INFORMATION | GROUP_SECURITY_INFORMATION | DACL_SECURITY_INFORMATION;

    fn unix(uid: u32, gid: u32, mode: u32, is_directory: bool) -> UnixSecurity {
        UnixSecurity {
            uid,
            gid,
            mode,
            is_directory,
        }
    }

    #[test]
    fn sids_print_and_map_as_samba_unix_sids() {
        assert_eq!(Sid::unix_user(1000).to_string(), "S-1-22-1-1000");
        assert_eq!(Sid::unix_group(0).to_string(), "S-1-22-2-0");
        assert_eq!(Sid::everyone().to_string(), "S-1-1-0");
        assert_eq!(Sid::unix_user(7).unix_uid(), Some(7));
        assert_eq!(Sid::unix_user(7).unix_gid(), None);
        assert_eq!(Sid::unix_group(7).unix_gid(), Some(7));
        assert_eq!(Sid::everyone().unix_uid(), None);
    }

    #[test]
    fn a_mode_becomes_owner_group_and_everyone_aces() {
        let sd = describe(&unix(1000, 100, 0o100640, false), ALL);
        let bytes = sd.encode();
        // Header, two SIDs of 16 bytes, an ACL of 8 + 3 ACEs.
        assert_eq!(bytes.len(), 20 + 16 + 16 + 8 + 24 + 24 + 20);
        assert_eq!(&bytes[..4], [1, 0, 0x04, 0x80]);
        let back = SecurityDescriptor::parse(&bytes).unwrap();
        assert_eq!(back, sd);
        let aces = &back.dacl.unwrap().aces;
        assert_eq!(
            aces[0].mask,
            FILE_GENERIC_READ | FILE_GENERIC_WRITE | DELETE
        );
        assert_eq!(aces[0].sid, Some(Sid::unix_user(1000)));
        assert_eq!(aces[1].mask, FILE_GENERIC_READ);
        assert_eq!(aces[1].sid, Some(Sid::unix_group(100)));
        assert_eq!(aces[2].mask, 0);
        assert_eq!(aces[2].sid, Some(Sid::everyone()));
        let dir = describe(&unix(0, 0, 0o755, true), DACL_SECURITY_INFORMATION);
        let aces = &dir.dacl.as_ref().unwrap().aces;
        assert_eq!(aces[0].mask, FILE_ALL_ACCESS);
        assert_eq!(aces[1].mask, FILE_GENERIC_READ | FILE_GENERIC_EXECUTE);
        assert!(dir.owner.is_none() && dir.group.is_none());
    }

    #[test]
    fn only_the_asked_parts_are_returned() {
        let s = unix(5, 6, 0o644, false);
        let none = describe(&s, 0).encode();
        assert_eq!(
            none,
            [
                1, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        let owner = SecurityDescriptor::parse(&describe(&s, OWNER_SECURITY_INFORMATION).encode());
        let owner = owner.unwrap();
        assert_eq!(owner.owner, Some(Sid::unix_user(5)));
        assert!(owner.group.is_none() && owner.dacl.is_none() && !owner.dacl_present);
        // A SACL is never described.
        assert!(describe(&s, SACL_SECURITY_INFORMATION).sacl.is_none());
    }

    #[test]
    fn every_mode_round_trips_through_its_dacl() {
        for mode in 0..=0o777 {
            for dir in [false, true] {
                let s = unix(1, 2, 0o4000 | mode, dir);
                let sd = SecurityDescriptor::parse(&describe(&s, ALL).encode()).unwrap();
                let change = change_for(&unix(1, 2, 0o4000, dir), &sd, ALL).unwrap();
                let expected = (mode != 0).then_some(0o4000 | mode);
                assert_eq!(change.mode, expected, "mode {mode:o}");
                assert_eq!((change.uid, change.gid), (None, None));
            }
        }
    }

    fn dacl(aces: Vec<Ace>) -> SecurityDescriptor {
        SecurityDescriptor {
            owner: None,
            group: None,
            dacl_present: true,
            dacl: Some(Acl {
                revision: ACL_REVISION,
                aces,
            }),
            sacl: None,
        }
    }

    #[test]
    fn dacls_map_to_modes_or_are_refused() {
        let cur = unix(1, 2, 0o644, false);
        let set = |sd: &SecurityDescriptor| change_for(&cur, sd, DACL_SECURITY_INFORMATION);
        // Generic rights, several ACEs for one class, a missing class.
        let sd = dacl(vec![
            Ace::allow(GENERIC_READ, Sid::unix_user(1)),
            Ace::allow(FILE_APPEND_DATA, Sid::unix_user(1)),
            Ace::allow(GENERIC_ALL, Sid::everyone()),
        ]);
        assert_eq!(set(&sd).unwrap().mode, Some(0o607));
        // Inherit-only ACEs do not apply to the file.
        let mut io = Ace::allow(GENERIC_ALL, Sid::new(3, &[0]));
        io.flags = INHERIT_ONLY_ACE;
        let sd = dacl(vec![io, Ace::allow(FILE_GENERIC_READ, Sid::unix_user(1))]);
        assert_eq!(set(&sd).unwrap().mode, Some(0o400));
        // Another SID, a deny ACE, or a non-basic ACE cannot be kept.
        let other = dacl(vec![Ace::allow(GENERIC_ALL, Sid::new(5, &[11]))]);
        assert_eq!(set(&other), Err(SdError::Unmappable));
        let mut deny = Ace::allow(FILE_READ_DATA, Sid::everyone());
        deny.ace_type = ACCESS_DENIED_ACE_TYPE;
        assert_eq!(set(&dacl(vec![deny])), Err(SdError::Unmappable));
        let object = Ace {
            ace_type: 5,
            flags: 0,
            mask: 1,
            sid: None,
        };
        assert_eq!(set(&dacl(vec![object])), Err(SdError::Unmappable));
        // A NULL DACL, and no DACL at all, give everyone everything.
        let mut null = dacl(vec![]);
        null.dacl = None;
        assert_eq!(set(&null).unwrap().mode, Some(0o777));
        null.dacl_present = false;
        assert_eq!(set(&null).unwrap().mode, Some(0o777));
        // An empty DACL gives nobody anything.
        assert_eq!(set(&dacl(vec![])).unwrap().mode, Some(0));
    }

    #[test]
    fn owner_and_group_change_only_to_unix_sids() {
        let cur = unix(1, 2, 0o640, false);
        let mut sd = dacl(vec![
            Ace::allow(FILE_ALL_ACCESS, Sid::unix_user(9)),
            Ace::allow(FILE_GENERIC_READ, Sid::unix_group(8)),
        ]);
        sd.owner = Some(Sid::unix_user(9));
        sd.group = Some(Sid::unix_group(8));
        let change = change_for(&cur, &sd, ALL).unwrap();
        assert_eq!(
            (change.uid, change.gid, change.mode),
            (Some(9), Some(8), Some(0o740))
        );
        // The ACEs name the new owner, so they are checked against it.
        assert_eq!(
            change_for(&cur, &sd, DACL_SECURITY_INFORMATION),
            Err(SdError::Unmappable)
        );
        // Owner and group are only read when asked for.
        let change = change_for(&cur, &sd, OWNER_SECURITY_INFORMATION).unwrap();
        assert_eq!((change.uid, change.gid, change.mode), (Some(9), None, None));
        sd.owner = Some(Sid::everyone());
        assert_eq!(change_for(&cur, &sd, ALL), Err(SdError::InvalidOwner));
        sd.owner = Some(Sid::unix_group(1));
        assert_eq!(change_for(&cur, &sd, ALL), Err(SdError::InvalidOwner));
        sd.owner = None;
        sd.group = Some(Sid::unix_user(1));
        assert_eq!(change_for(&cur, &sd, ALL), Err(SdError::InvalidGroup));
    }

    #[test]
    fn malformed_descriptors_are_refused() {
        let good = describe(&unix(1, 2, 0o640, false), ALL).encode();
        assert!(SecurityDescriptor::parse(&good).is_ok());
        // Every truncation fails cleanly.
        for len in 0..good.len() {
            assert_eq!(
                SecurityDescriptor::parse(&good[..len]),
                Err(SdError::Malformed),
                "{len}"
            );
        }
        let with = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            SecurityDescriptor::parse(&b)
        };
        assert_eq!(with(0, &[2]), Err(SdError::Malformed), "revision");
        assert_eq!(with(3, &[0]), Err(SdError::Malformed), "not self-relative");
        assert_eq!(
            with(4, &[8, 0, 0, 0]),
            Err(SdError::Malformed),
            "owner inside header"
        );
        assert_eq!(
            with(4, &[0xff, 0xff, 0xff, 0xff]),
            Err(SdError::Malformed),
            "owner outside"
        );
        assert_eq!(
            with(21, &[16]),
            Err(SdError::Malformed),
            "16 subauthorities"
        );
        // The ACL: size past the buffer, an ACE count past its size, an ACE
        // too small to hold a mask, an ACE past the ACL.
        let acl = 20 + 16 + 16;
        assert_eq!(with(acl + 2, &[0xff, 0x00]), Err(SdError::Malformed));
        assert_eq!(with(acl + 4, &[4, 0]), Err(SdError::Malformed));
        assert_eq!(with(acl + 8 + 2, &[4, 0]), Err(SdError::Malformed));
        assert_eq!(with(acl + 8 + 2, &[0xf0, 0]), Err(SdError::Malformed));
        assert_eq!(with(acl, &[9]), Err(SdError::Malformed), "ACL revision");
    }

    /// Random and mutated descriptors: parsing never panics, and whatever
    /// parses encodes to a descriptor that parses to the same value.
    #[test]
    fn random_descriptors_never_panic() {
        let good = describe(&unix(1, 2, 0o751, true), ALL).encode();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20_000 {
            let mut buf = if round % 2 == 0 {
                good.clone()
            } else {
                (0..next() % 200).map(|_| next() as u8).collect()
            };
            if buf.len() > 4 && round % 4 != 1 {
                // Keep the header plausible so parsing goes deeper.
                buf[0] = 1;
                buf[3] |= 0x80;
            }
            for _ in 0..next() % 6 {
                if buf.is_empty() {
                    break;
                }
                let at = (next() % buf.len() as u64) as usize;
                buf[at] = next() as u8;
            }
            if round % 3 == 0 {
                let cut = (next() % (buf.len() as u64 + 1)) as usize;
                buf.truncate(cut);
            }
            if let Ok(sd) = SecurityDescriptor::parse(&buf) {
                let basic = |a: &Option<Acl>| {
                    a.as_ref()
                        .is_none_or(|a| a.aces.iter().all(|e| e.sid.is_some()))
                };
                if basic(&sd.dacl) && basic(&sd.sacl) {
                    assert_eq!(SecurityDescriptor::parse(&sd.encode()), Ok(sd.clone()));
                }
                let _ = change_for(
                    &unix(1, 2, 0o640, false),
                    &sd,
                    ALL | SACL_SECURITY_INFORMATION,
                );
            }
        }
    }
}
