//! Public value types of the namespace API.

/// Inode number. 1 is the root directory; 0 is never used.
pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// Longest name of one directory entry, in bytes (as POSIX NAME_MAX).
pub const NAME_BYTES_MAX: usize = 255;
/// Largest file the engine stores (1 PiB); offsets beyond it are refused.
pub const FILE_BYTES_MAX: u64 = 1 << 50;
/// Longest symlink target.
pub const SYMLINK_TARGET_BYTES_MAX: usize = 4096;
/// Longest extended attribute name and value.
pub const XATTR_NAME_BYTES_MAX: usize = 255;
pub const XATTR_VALUE_BYTES_MAX: usize = 64 * 1024;
/// Most hard links to one file.
pub const LINKS_MAX: u32 = 65_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix domain socket (the name only; no socket lives in the appliance).
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            FileKind::File => 1,
            FileKind::Dir => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDevice => 6,
            FileKind::BlockDevice => 7,
        }
    }

    /// Special files have no data: fifos, sockets and device nodes.
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice)
    }
    pub(crate) fn from_u8(v: u8) -> Option<FileKind> {
        match v {
            1 => Some(FileKind::File),
            2 => Some(FileKind::Dir),
            3 => Some(FileKind::Symlink),
            4 => Some(FileKind::Fifo),
            5 => Some(FileKind::Socket),
            6 => Some(FileKind::CharDevice),
            7 => Some(FileKind::BlockDevice),
            _ => None,
        }
    }
}

/// Attributes of one inode. Times are nanoseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (0o7777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub btime_ns: i64,
    /// Bumped by every mutation of this inode (data or attributes).
    pub version: u64,
    /// Distinguishes reuse of an inode number; part of every file handle.
    pub generation: u64,
    /// Bytes of storage the file's data occupies before erasure coding.
    pub stored_bytes: u64,
    /// Device number (major << 32 | minor) of character and block devices; 0 otherwise.
    pub rdev: u64,
}

/// Which attributes a setattr changes.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

#[derive(Debug, Clone, Copy)]
pub enum TimeSet {
    Now,
    At(i64),
}

/// How durable a write must be before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stability {
    /// Kept in the per-file write buffer; lost by a crash until commit (NFS UNSTABLE).
    Unstable,
    /// On the drives and in metadata, fsynced, before the call returns (NFS FILE_SYNC, fsync).
    Durable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
}

/// One page of a directory listing; `next_cursor` resumes after the last entry.
#[derive(Debug, Clone)]
pub struct DirPage {
    pub entries: Vec<DirEntry>,
    pub next_cursor: Option<Vec<u8>>,
}

#[derive(Debug, Clone)]
pub struct StatFs {
    /// Usable bytes (raw capacity times k/(k+m)).
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub files: u64,
    pub raw_total_bytes: u64,
    pub raw_free_bytes: u64,
    pub name_bytes_max: u32,
}

/// Roles of API tokens and users for the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Files only, with the user's own permissions.
    User,
    /// May read every admin resource but change none.
    ReadOnly,
    /// May run jobs and manage drives, not identities.
    Operator,
    /// Everything.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::ReadOnly => "read-only",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "user" => Some(Role::User),
            "read-only" | "readonly" => Some(Role::ReadOnly),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            Role::User => 0,
            Role::ReadOnly => 1,
            Role::Operator => 2,
            Role::Admin => 3,
        }
    }
    pub(crate) fn from_u8(v: u8) -> Option<Role> {
        match v {
            0 => Some(Role::User),
            1 => Some(Role::ReadOnly),
            2 => Some(Role::Operator),
            3 => Some(Role::Admin),
            _ => None,
        }
    }
}

/// Who is asking. Every namespace call carries one; the engine checks permissions against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    pub role: Role,
}

impl Caller {
    /// The engine itself (background jobs, startup repair): uid 0, admin.
    pub fn system() -> Caller {
        Caller { user: "system".into(), uid: 0, gid: 0, groups: vec![], role: Role::Admin }
    }
    /// An unauthenticated client where an admin allowed anonymous access: nobody/nogroup.
    pub fn anonymous() -> Caller {
        Caller { user: "anonymous".into(), uid: 65534, gid: 65534, groups: vec![], role: Role::User }
    }
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// What changed; emitted after the mutation is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeEvent {
    pub ino: Ino,
    pub version: u64,
    pub kind: ChangeKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    Created { parent: Ino, name: Vec<u8> },
    Removed { parent: Ino, name: Vec<u8> },
    Renamed { from_parent: Ino, from_name: Vec<u8>, to_parent: Ino, to_name: Vec<u8> },
    Data,
    Attr,
}

/// (year, month 1-12, day 1-31) of the proleptic Gregorian calendar for a count of days since
/// 1970-01-01 (Howard Hinnant's `civil_from_days`): dates for listings, logs and signatures
/// without a calendar crate.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_those_of_the_gregorian_calendar() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(20_429), (2025, 12, 7));
        // Every day of 1900-2099 follows the one before it.
        let mut prev = civil_from_days(-25_567);
        assert_eq!(prev, (1900, 1, 1));
        for day in -25_566..47_482 {
            let d = civil_from_days(day);
            let next_in_month = d == (prev.0, prev.1, prev.2 + 1);
            let next_month = d.2 == 1 && (d == (prev.0, prev.1 + 1, 1) || (prev.1 == 12 && d == (prev.0 + 1, 1, 1)));
            assert!(next_in_month || next_month, "{prev:?} then {d:?}");
            prev = d;
        }
        assert_eq!(prev, (2099, 12, 31));
    }
}
