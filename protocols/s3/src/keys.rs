//! Which S3 keys Aquifer can store. A key is a path below the bucket directory, so a key
//! must split at '/' into names a directory can hold.
//!
//! Refused, with `InvalidArgument` and a message that says why: empty components (`a//b`,
//! a leading `/`), `.` or `..` components, NUL bytes. Over-long keys (more than 1024 bytes)
//! and components over 255 bytes get `KeyTooLongError`. A key ending in '/' is a folder
//! object: its PUT creates the directory and keeps the content (at most 64 KiB) as the
//! directory's `XATTR_FOLDER_OBJECT`, so listings show it.

use s3s::{S3Error, S3ErrorCode, S3Result};
use storage_engine::NAME_BYTES_MAX;

/// Longest object key, in bytes (as S3).
pub const KEY_BYTES_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyForm<'k> {
    /// A file: the key as given.
    Object(&'k str),
    /// `prefix/`: the directory `prefix`.
    Dir(&'k str),
}

fn invalid(msg: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, format!("object key refused: {msg}"))
}

pub(crate) fn parse_key(key: &str) -> S3Result<KeyForm<'_>> {
    if key.is_empty() {
        return Err(invalid("the key is empty"));
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(S3Error::with_message(S3ErrorCode::KeyTooLongError, format!("object keys are at most {KEY_BYTES_MAX} bytes")));
    }
    if key.contains('\0') {
        return Err(invalid("it contains a NUL byte"));
    }
    let (path, form) = match key.strip_suffix('/') {
        Some(p) => (p, KeyForm::Dir(p)),
        None => (key, KeyForm::Object(key)),
    };
    if path.is_empty() {
        return Err(invalid("the key is only '/'"));
    }
    for c in path.split('/') {
        if c.is_empty() {
            return Err(invalid("it has an empty path component ('//' or a leading '/')"));
        }
        if c == "." || c == ".." {
            return Err(invalid("it has a '.' or '..' path component"));
        }
        if c.len() > NAME_BYTES_MAX {
            return Err(S3Error::with_message(
                S3ErrorCode::KeyTooLongError,
                format!("each '/'-separated part of a key is at most {NAME_BYTES_MAX} bytes"),
            ));
        }
    }
    Ok(form)
}

/// Like [`parse_key`] but only plain objects (copies, and reads that need a file).
pub(crate) fn object_key(key: &str) -> S3Result<&str> {
    match parse_key(key)? {
        KeyForm::Object(k) => Ok(k),
        KeyForm::Dir(_) => Err(invalid("a key ending in '/' names a folder object (a directory), which this request cannot take")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_are_paths_pass_and_others_are_refused() {
        assert_eq!(parse_key("a/b/c.txt").unwrap(), KeyForm::Object("a/b/c.txt"));
        assert_eq!(parse_key("a/b/").unwrap(), KeyForm::Dir("a/b"));
        assert_eq!(parse_key("a-b").unwrap(), KeyForm::Object("a-b"));
        for bad in ["", "/", "a//b", "/a", "a/./b", "a/../b", "..", "a\0b", "a//"] {
            let e = parse_key(bad).unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{bad:?}");
        }
        let long = "k".repeat(KEY_BYTES_MAX + 1);
        assert_eq!(*parse_key(&long).unwrap_err().code(), S3ErrorCode::KeyTooLongError);
        let long_component = format!("a/{}", "n".repeat(NAME_BYTES_MAX + 1));
        assert_eq!(*parse_key(&long_component).unwrap_err().code(), S3ErrorCode::KeyTooLongError);
        assert!(object_key("dir/").is_err());
    }
}
