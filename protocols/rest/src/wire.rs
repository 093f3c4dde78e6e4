//! Wire types of the REST API. The engine's types carry no serde; they are converted here, at
//! the boundary, so that the engine can change its representation without breaking clients.

use serde::{Deserialize, Serialize};
use storage_engine as se;

#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

// ------------------------------------------------------------------ health, drives, pools

#[derive(Debug, Serialize, Deserialize)]
pub struct Health {
    /// "ok", "degraded" or "failed".
    pub state: String,
    pub notes: Vec<String>,
    pub drives: Vec<DriveHealth>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DriveHealth {
    pub index: u32,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Drive {
    pub index: u32,
    pub path: String,
    pub uuid: String,
    pub epoch: u32,
    pub pool: String,
    /// "online", "failed" or "rebuilding".
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub backend: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    pub repaired_shards: u64,
}

fn drive_state(s: &se::DriveState) -> (String, Option<String>) {
    let reason = match s {
        se::DriveState::Failed(r) => Some(r.clone()),
        _ => None,
    };
    (s.as_str().to_string(), reason)
}

impl From<&se::DriveInfo> for Drive {
    fn from(d: &se::DriveInfo) -> Drive {
        let (state, reason) = drive_state(&d.state);
        Drive {
            index: d.index,
            path: d.path.display().to_string(),
            uuid: d.uuid.clone(),
            epoch: d.epoch,
            pool: d.pool.clone(),
            state,
            reason,
            backend: d.backend.clone(),
            capacity_bytes: d.capacity_bytes,
            used_bytes: d.used_bytes,
            read_errors: d.read_errors,
            write_errors: d.write_errors,
            checksum_errors: d.checksum_errors,
            repaired_shards: d.repaired_shards,
        }
    }
}

impl From<&se::Health> for Health {
    fn from(h: &se::Health) -> Health {
        Health {
            state: h.state.to_string(),
            notes: h.notes.clone(),
            drives: h
                .drives
                .iter()
                .map(|d| {
                    let (state, reason) = drive_state(&d.state);
                    DriveHealth { index: d.index, state, reason }
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, Default)]
pub struct ReplaceDrive {
    /// A new drive file or device; without it the slot's current path is reused.
    #[serde(default)]
    pub path: Option<String>,
    /// Size of a drive file created at `path` when it is missing.
    #[serde(default)]
    pub size_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FailDrive {
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Pool {
    pub name: String,
    pub data_shards: usize,
    pub parity_shards: usize,
    pub drives: Vec<u32>,
    pub raw_capacity_bytes: u64,
    pub raw_used_bytes: u64,
}

impl From<&se::PoolInfo> for Pool {
    fn from(p: &se::PoolInfo) -> Pool {
        Pool {
            name: p.name.clone(),
            data_shards: p.data_shards,
            parity_shards: p.parity_shards,
            drives: p.drives.clone(),
            raw_capacity_bytes: p.raw_capacity_bytes,
            raw_used_bytes: p.raw_used_bytes,
        }
    }
}

/// The data cache: verified stripe data kept in memory for reads.
#[derive(Debug, Serialize, Deserialize)]
pub struct DataCache {
    /// Budget (`[engine] data_cache_bytes`); 0: no cache.
    pub max_bytes: u64,
    pub bytes: u64,
    /// Shards kept.
    pub entries: u64,
    /// Shard reads answered from memory, and those that went to a drive, since the start.
    pub hits: u64,
    pub misses: u64,
}

impl From<&se::DataCacheStats> for DataCache {
    fn from(c: &se::DataCacheStats) -> DataCache {
        DataCache { max_bytes: c.max_bytes, bytes: c.bytes, entries: c.entries, hits: c.hits, misses: c.misses }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Capacity {
    /// Usable bytes: raw capacity times k/(k+m).
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub files: u64,
    pub raw_total_bytes: u64,
    pub raw_free_bytes: u64,
}

impl From<&se::StatFs> for Capacity {
    fn from(s: &se::StatFs) -> Capacity {
        Capacity {
            total_bytes: s.total_bytes,
            free_bytes: s.free_bytes,
            used_bytes: s.total_bytes.saturating_sub(s.free_bytes),
            files: s.files,
            raw_total_bytes: s.raw_total_bytes,
            raw_free_bytes: s.raw_free_bytes,
        }
    }
}

// ------------------------------------------------------------------ identities

#[derive(Debug, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// "user", "read-only", "operator" or "admin".
    pub role: String,
    pub disabled: bool,
}

impl From<&se::UserInfo> for User {
    fn from(u: &se::UserInfo) -> User {
        User {
            name: u.name.clone(),
            uid: u.uid,
            gid: u.gid,
            groups: u.groups.clone(),
            role: u.role.as_str().to_string(),
            disabled: u.disabled,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    pub name: String,
    pub password: String,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    #[serde(default)]
    pub groups: Vec<u32>,
    #[serde(default)]
    pub role: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Group {
    pub name: String,
    pub gid: u32,
}

impl From<&se::GroupInfo> for Group {
    fn from(g: &se::GroupInfo) -> Group {
        Group { name: g.name.clone(), gid: g.gid }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewGroup {
    pub name: String,
    #[serde(default)]
    pub gid: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// Whose token; default the caller. Only admins issue tokens for others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Default the user's own role; never higher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Lifetime in seconds; none means no expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Token {
    pub id: String,
    pub user: String,
    pub role: String,
    pub created_ns: i64,
    /// Absent for a token that never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ns: Option<i64>,
    pub label: String,
}

impl From<&se::TokenInfo> for Token {
    fn from(t: &se::TokenInfo) -> Token {
        Token {
            id: t.id.clone(),
            user: t.user.clone(),
            role: t.role.as_str().to_string(),
            created_ns: t.created_ns,
            expires_ns: (t.expires_ns != 0).then_some(t.expires_ns),
            label: t.label.clone(),
        }
    }
}

/// A newly issued token: the secret is shown this once.
#[derive(Debug, Serialize, Deserialize)]
pub struct TokenIssued {
    pub token: String,
    pub info: Token,
}

/// Body of `POST /users/{name}/s3-keys`: empty (generate) or both fields (store this pair).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewS3Key {
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
}

/// A new S3 key pair: the secret is shown this once.
#[derive(Debug, Serialize, Deserialize)]
pub struct S3KeyIssued {
    pub access_key: String,
    pub secret_key: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct S3Key {
    pub access_key: String,
    pub user: String,
    pub created_ns: i64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSshKey {
    /// One OpenSSH public key line.
    pub key: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SshKey {
    pub id: String,
    pub key: String,
}

// ------------------------------------------------------------------ jobs

#[derive(Debug, Serialize, Deserialize)]
pub struct Job {
    pub id: u64,
    /// "scrub" or "rebuild".
    pub kind: String,
    /// The drive a rebuild fills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drive: Option<u32>,
    /// "running", "completed", "failed" or "cancelled".
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// 0..1.
    pub progress: f64,
    pub started_ns: i64,
    pub finished_ns: i64,
    pub stripes_total: u64,
    pub stripes_done: u64,
    pub bytes_done: u64,
    pub shards_bad: u64,
    pub shards_repaired: u64,
    pub stripes_unrecoverable: u64,
    pub bytes_per_sec_max: u64,
}

impl From<&se::JobInfo> for Job {
    fn from(j: &se::JobInfo) -> Job {
        Job {
            id: j.id,
            kind: j.kind.name().to_string(),
            drive: match j.kind {
                se::JobKind::Rebuild { drive } => Some(drive),
                se::JobKind::Scrub => None,
            },
            state: j.state.as_str().to_string(),
            error: match &j.state {
                se::JobState::Failed(m) => Some(m.clone()),
                _ => None,
            },
            progress: j.progress(),
            started_ns: j.started_ns,
            finished_ns: j.finished_ns,
            stripes_total: j.stripes_total,
            stripes_done: j.stripes_done,
            bytes_done: j.bytes_done,
            shards_bad: j.shards_bad,
            shards_repaired: j.shards_repaired,
            stripes_unrecoverable: j.stripes_unrecoverable,
            bytes_per_sec_max: j.bytes_per_sec_max,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewJob {
    /// "scrub" or "rebuild".
    pub kind: String,
    /// Required for a rebuild.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drive: Option<u32>,
    /// Throttle; 0 or absent = unthrottled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sec_max: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct JobStarted {
    pub job_id: u64,
}

// ------------------------------------------------------------------ files

#[derive(Debug, Serialize, Deserialize)]
pub struct FileAttrs {
    pub ino: u64,
    /// "file", "dir" or "symlink".
    pub kind: String,
    /// Permission bits, e.g. 420 (= 0o644).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub version: u64,
    /// The HTTP entity tag of this version of the content.
    pub etag: String,
}

pub fn kind_str(k: se::FileKind) -> &'static str {
    match k {
        se::FileKind::File => "file",
        se::FileKind::Dir => "dir",
        se::FileKind::Symlink => "symlink",
        se::FileKind::Fifo => "fifo",
        se::FileKind::Socket => "socket",
        se::FileKind::CharDevice => "char-device",
        se::FileKind::BlockDevice => "block-device",
    }
}

/// The entity tag of one version of an inode, quoted as HTTP wants it.
pub fn etag_of(a: &se::Attr) -> String {
    format!("\"{:x}-{:x}\"", a.ino, a.version)
}

impl From<&se::Attr> for FileAttrs {
    fn from(a: &se::Attr) -> FileAttrs {
        FileAttrs {
            ino: a.ino,
            kind: kind_str(a.kind).to_string(),
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: a.size,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            version: a.version,
            etag: etag_of(a),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<DirEntry>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DirEntry {
    /// The name; bytes that are not UTF-8 are shown as U+FFFD.
    pub name: String,
    pub ino: u64,
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rename {
    /// Absolute destination path; an existing file there is replaced.
    pub rename_to: String,
}
