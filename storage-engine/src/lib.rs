//! Aquifer's storage engine: the one namespace every protocol serves (DESIGN.md §3).
//!
//! Metadata lives in RocksDB (one write batch per mutation); file data above the inline
//! threshold lives in erasure-coded stripes on drives reached through io_uring. Permission
//! checks happen here, once, for every protocol.

mod cache;
mod data;
pub mod ec;
mod engine;
mod error;
mod group_sync;
mod identity;
mod jobs;
mod log_warm;
mod objects;
mod records;
mod remote;
mod settings;
mod types;
mod versions;
mod writebuf;

pub use cache::DataCacheStats;
pub use data::{DriveCounters, DriveInfo, DriveState, ReadBytes};
/// Buffers a caller fills and hands to [`Engine::write_shared`] without a copy.
pub use hardware::{AlignedBuf, FillBuf};
pub use engine::{Clock, DriveConfig, DriveWrapper, Engine, EngineConfig, Health, LOG_REUSE_BYTES_DEFAULT, PoolConfig, PoolInfo, SystemClock};
pub use error::{Error, NameProblem, Result};
pub use identity::{GroupInfo, NewUser, PASSWORD_BYTES_MIN, S3KeyInfo, TokenInfo, UserInfo, UserUpdate};
pub use jobs::{JobInfo, JobKind, JobState};
pub use objects::{LIST_KEYS_MAX, ObjectEntry, ObjectPage, PARTS_MAX, PartInfo, UploadInfo, XATTR_FOLDER_OBJECT, split_key};
pub use remote::{Mutation, Need, PORTAL_CALLER, RemoteAttr, RemoteSource, RemoteStub, Verdict};
pub use settings::{AUDIT_PAGE_MAX, AuditRecord, SETTING_KEY_BYTES_MAX, SETTING_VALUE_BYTES_MAX};
pub use types::*;
pub use versions::{FoundVersion, NULL_VERSION, VersionEntry, VersionKind, VersionMode, VersionPage, is_version_id};
