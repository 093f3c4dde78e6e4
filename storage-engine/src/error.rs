//! The one error type of the storage engine. Every protocol maps it once to its own codes
//! (NFS3ERR_*, NTSTATUS, S3 error codes, SFTP status, HTTP status).

use std::fmt;

/// Why a name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameProblem {
    Empty,
    Dot,
    Slash,
    Nul,
    TooLong,
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameProblem::Empty => "name is empty",
            NameProblem::Dot => "name is '.' or '..'",
            NameProblem::Slash => "name contains '/'",
            NameProblem::Nul => "name contains a NUL byte",
            NameProblem::TooLong => "name is longer than 255 bytes",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("permission denied")]
    PermissionDenied,
    #[error("authentication failed")]
    Unauthenticated,
    #[error("invalid name: {0}")]
    InvalidName(NameProblem),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("file too large")]
    FileTooLarge,
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("stale handle")]
    Stale,
    #[error("too many links")]
    TooManyLinks,
    #[error("not a symbolic link")]
    NotSymlink,
    #[error("operation not supported: {0}")]
    NotSupported(String),
    #[error("read-only: {0}")]
    ReadOnly(String),
    #[error("busy: {0}")]
    Busy(String),
    #[error("data unavailable: {0}")]
    Unavailable(String),
    #[error("i/o error: {0}")]
    Io(String),
    #[error("metadata corrupt: {0}")]
    Corrupt(String),
    #[error("metadata store error: {0}")]
    Metadata(String),
}

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Self {
        Error::Metadata(e.into_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The closest POSIX errno, for protocols that speak errno (NFS, SFTP, FUSE).
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc_errno::ENOENT,
            Error::Exists => libc_errno::EEXIST,
            Error::NotDir => libc_errno::ENOTDIR,
            Error::IsDir => libc_errno::EISDIR,
            Error::NotEmpty => libc_errno::ENOTEMPTY,
            Error::PermissionDenied => libc_errno::EACCES,
            Error::Unauthenticated => libc_errno::EACCES,
            Error::InvalidName(NameProblem::TooLong) => libc_errno::ENAMETOOLONG,
            Error::InvalidName(_) | Error::InvalidArgument(_) => libc_errno::EINVAL,
            Error::FileTooLarge => libc_errno::EFBIG,
            Error::NoSpace(_) => libc_errno::ENOSPC,
            Error::Stale => libc_errno::ESTALE,
            Error::TooManyLinks => libc_errno::EMLINK,
            Error::NotSymlink => libc_errno::EINVAL,
            Error::NotSupported(_) => libc_errno::EOPNOTSUPP,
            Error::Busy(_) => libc_errno::EBUSY,
            Error::ReadOnly(_) => libc_errno::EROFS,
            Error::Unavailable(_) | Error::Io(_) | Error::Corrupt(_) | Error::Metadata(_) => {
                libc_errno::EIO
            }
        }
    }
}

/// Linux errno values; spelled out so the engine does not need libc for them.
mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EACCES: i32 = 13;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const EMLINK: i32 = 31;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOTEMPTY: i32 = 39;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ESTALE: i32 = 116;
}
