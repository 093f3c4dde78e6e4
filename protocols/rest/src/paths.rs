//! File API paths: percent-decoded, validated component by component before anything in the
//! namespace is touched, so that a bad name never leaves a half-made change behind.

use storage_engine::{Attr, Caller, Engine, Error, FileKind, NAME_BYTES_MAX, ROOT_INO};

use crate::error::ApiError;

/// Longest path the file API accepts, in bytes after decoding (as POSIX PATH_MAX).
pub const PATH_BYTES_MAX: usize = 4096;

/// A validated path below the root: every component is UTF-8, 1..=255 bytes, without `/` or
/// NUL, and neither `.` nor `..`. No components means the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsPath {
    pub comps: Vec<String>,
}

impl FsPath {
    /// The path as users write it, starting with `/`.
    pub fn display(&self) -> String {
        format!("/{}", self.comps.join("/"))
    }

    /// Parses the still percent-encoded tail of a request path (after `/files/`).
    pub fn from_url(raw: &str) -> Result<FsPath, ApiError> {
        if raw.is_empty() {
            return Ok(FsPath { comps: vec![] });
        }
        let mut comps = Vec::new();
        let mut total = 0;
        for enc in raw.split('/') {
            let bytes: Vec<u8> = percent_encoding::percent_decode_str(enc).collect();
            let comp = String::from_utf8(bytes).map_err(|_| invalid("path is not valid UTF-8"))?;
            total += comp.len() + 1;
            check_component(&comp)?;
            comps.push(comp);
        }
        if total > PATH_BYTES_MAX {
            return Err(invalid(format!("path is longer than {PATH_BYTES_MAX} bytes")));
        }
        Ok(FsPath { comps })
    }

    /// Parses an already decoded absolute path such as a rename destination.
    pub fn from_plain(path: &str) -> Result<FsPath, ApiError> {
        if path.len() > PATH_BYTES_MAX {
            return Err(invalid(format!("path is longer than {PATH_BYTES_MAX} bytes")));
        }
        let rel = path.strip_prefix('/').unwrap_or(path);
        if rel.is_empty() {
            return Ok(FsPath { comps: vec![] });
        }
        let comps: Vec<String> = rel.split('/').map(str::to_string).collect();
        for c in &comps {
            check_component(c)?;
        }
        Ok(FsPath { comps })
    }

    /// Splits into the parent's components and the last name; `None` for the root.
    pub fn split_last(&self) -> Option<(&[String], &str)> {
        let (last, parent) = self.comps.split_last()?;
        Some((parent, last.as_str()))
    }
}

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::new(axum::http::StatusCode::BAD_REQUEST, "invalid_name", msg)
}

fn check_component(c: &str) -> Result<(), ApiError> {
    if c.is_empty() {
        return Err(invalid("path has an empty component"));
    }
    if c == "." || c == ".." {
        return Err(invalid("path component is '.' or '..'"));
    }
    if c.contains('/') {
        return Err(invalid("path component contains '/'"));
    }
    if c.contains('\0') {
        return Err(invalid("path component contains a NUL byte"));
    }
    if c.len() > NAME_BYTES_MAX {
        return Err(invalid(format!("path component is longer than {NAME_BYTES_MAX} bytes")));
    }
    Ok(())
}

/// Looks up every component from the root. Blocking.
pub fn walk(engine: &Engine, caller: &Caller, comps: &[String]) -> storage_engine::Result<Attr> {
    let mut cur = engine.getattr(caller, ROOT_INO)?;
    for c in comps {
        if cur.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        cur = engine.lookup(caller, cur.ino, c.as_bytes())?;
    }
    Ok(cur)
}

/// Like [`walk`], creating missing directories (mode 0755) on the way. Blocking.
pub fn walk_create(engine: &Engine, caller: &Caller, comps: &[String]) -> storage_engine::Result<Attr> {
    let mut cur = engine.getattr(caller, ROOT_INO)?;
    for c in comps {
        if cur.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        cur = match engine.lookup(caller, cur.ino, c.as_bytes()) {
            Ok(a) => a,
            Err(Error::NotFound) => match engine.mkdir(caller, cur.ino, c.as_bytes(), 0o755) {
                Ok(a) => a,
                // Another client made it meanwhile.
                Err(Error::Exists) => engine.lookup(caller, cur.ino, c.as_bytes())?,
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        };
    }
    if cur.kind != FileKind::Dir {
        return Err(Error::NotDir);
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_validates_components() {
        assert_eq!(FsPath::from_url("a/b%20c/d").unwrap().comps, vec!["a", "b c", "d"]);
        assert_eq!(FsPath::from_url("").unwrap().comps, Vec::<String>::new());
        assert_eq!(FsPath::from_url("%C3%A9t%C3%A9").unwrap().comps, vec!["été"]);
        for bad in ["a//b", "a/", "/a", "a/../b", "./a", "%2E%2E", "a%00b", "a%2Fb", "%FF", &"x".repeat(256)] {
            let e = FsPath::from_url(bad).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
        }
        assert!(FsPath::from_url(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn plain_paths() {
        assert_eq!(FsPath::from_plain("/x/y").unwrap().comps, vec!["x", "y"]);
        assert_eq!(FsPath::from_plain("x").unwrap().comps, vec!["x"]);
        assert!(FsPath::from_plain("/").unwrap().comps.is_empty());
        assert!(FsPath::from_plain("/x/../y").is_err());
        assert!(FsPath::from_plain("/x//y").is_err());
    }
}
