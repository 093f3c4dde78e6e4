//! 8.3 short names (Aquifer patch): which names are already valid 8.3
//! names (MS-FSCC 2.1.5.2.1), and a short name for every other one, made
//! from the name alone as Samba's default `hash2` mangling makes it, so
//! that it needs no storage and is the same on every server start.
//!
//! A short name is the first character of the long name (uppercased, `_`
//! when it cannot appear in an 8.3 name), five characters of a hash of the
//! whole long name, `~`, a sixth hash character, and the first three
//! characters that may appear in an 8.3 name of the long name's extension,
//! uppercased: `testsmb2_file.dat` becomes something like `T4Q0ZL~K.DAT`.
//! Two long names in one directory may hash alike (about one pair in two
//! billion); an open by that short name then finds the first in listing
//! order, as on Samba.

/// Hash characters: digits and uppercase letters.
const BASE36: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Characters an 8.3 name may hold besides letters and digits (MS-FSCC
/// 2.1.5.2.1 leaves out `"*+,/:;<=>?[\]|`, space, `.` and controls).
fn valid_83_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'()-@^_`{}~".contains(c)
}

/// Whether `name` is a valid 8.3 name (MS-FSCC 2.1.5.2.1): one to eight
/// characters, optionally a dot and one to three more, all of them
/// characters an 8.3 name may hold. Case does not matter. `.` and `..`
/// count as 8.3 names.
pub fn is_8_3(name: &str) -> bool {
    if name == "." || name == ".." {
        return true;
    }
    let (base, ext) = match name.split_once('.') {
        Some((base, ext)) => (base, Some(ext)),
        None => (name, None),
    };
    let valid =
        |part: &str, max: usize| (1..=max).contains(&part.len()) && part.chars().all(valid_83_char);
    valid(base, 8) && ext.is_none_or(|ext| valid(ext, 3))
}

/// FNV-1a over the name's UTF-8 bytes: fixed here, so short names stay the
/// same across restarts and versions. Case is kept: on a case-sensitive
/// share `a.txtx` and `A.txtx` are two files and get two short names.
fn hash(name: &str) -> u32 {
    name.bytes().fold(0x811C_9DC5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The short name of `name`, `None` when `name` is a valid 8.3 name itself
/// (its own short name, as NTFS keeps one name for both).
pub fn short_name(name: &str) -> Option<String> {
    if is_8_3(name) {
        return None;
    }
    let lead = name
        .chars()
        .next()
        .filter(|c| valid_83_char(*c))
        .map_or('_', |c| c.to_ascii_uppercase());
    let ext: String = match name.rfind('.') {
        Some(dot) if dot > 0 => name[dot + 1..]
            .chars()
            .filter(|c| valid_83_char(*c))
            .take(3)
            .map(|c| c.to_ascii_uppercase())
            .collect(),
        _ => String::new(),
    };
    let mut v = hash(name) as usize;
    let mut chars = [0u8; 6];
    for c in chars.iter_mut().rev() {
        *c = BASE36[v % 36];
        v /= 36;
    }
    let mut out = String::with_capacity(12);
    out.push(lead);
    out.push_str(std::str::from_utf8(&chars[..5]).expect("ASCII"));
    out.push('~');
    out.push(char::from(chars[5]));
    if !ext.is_empty() {
        out.push('.');
        out.push_str(&ext);
    }
    Some(out)
}

/// Whether `name` has the shape of a short name [`short_name`] makes (or
/// Windows makes: `PROGRA~1`): eight characters with `~` at the seventh,
/// optionally an extension of one to three. Only such names are looked up
/// as short names.
pub fn looks_like_short_name(name: &str) -> bool {
    let (base, ext) = match name.split_once('.') {
        Some((base, ext)) => (base, ext),
        None => (name, ""),
    };
    base.len() == 8 && base.as_bytes()[6] == b'~' && ext.len() <= 3 && is_8_3(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_already_8_3_have_no_other_short_name() {
        for name in [
            "bufsize.txt",
            "README",
            "A.B",
            "x~1.c",
            "12345678.123",
            ".",
            "..",
        ] {
            assert!(is_8_3(name), "{name}");
            assert_eq!(short_name(name), None, "{name}");
        }
        for name in [
            "123456789",
            "a.text",
            "a b.txt",
            "a.b.c",
            ".profile",
            "a+b",
            "é.txt",
            "a.",
            "",
        ] {
            assert!(!is_8_3(name), "{name}");
        }
    }

    #[test]
    fn short_names_are_8_3_stable_and_tell_names_apart() {
        let s = short_name("testsmb2_file.dat").unwrap();
        assert!(is_8_3(&s) && looks_like_short_name(&s), "{s}");
        assert!(
            s.starts_with('T') && s.ends_with(".DAT") && s.len() == 12,
            "{s}"
        );
        // The same on every call and every start: the hash is fixed.
        assert_eq!(short_name("testsmb2_file.dat").unwrap(), s);
        assert_eq!(short_name("Long File Name.html").unwrap().len(), 12);
        assert!(short_name("Long File Name.html").unwrap().ends_with(".HTM"));
        assert_ne!(short_name("a.txtx"), short_name("A.txtx"));
        assert_eq!(
            short_name(".profile").unwrap().len(),
            8,
            "no extension after a leading dot"
        );
        assert!(short_name("été.txt").unwrap().starts_with("_"));
        assert!(!looks_like_short_name("bufsize.txt"));
        assert!(looks_like_short_name("PROGRA~1"));
    }
}
