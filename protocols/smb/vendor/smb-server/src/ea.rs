//! Extended attributes (Aquifer patch): the FILE_FULL_EA_INFORMATION and
//! FILE_GET_EA_INFORMATION lists of MS-FSCC 2.4.15 and 2.4.15.1, the rules
//! MS-FSA 2.1.5.15.5 gives for names, flags and sizes, and the EaSize of
//! MS-FSA 2.1.5.12.10.
//!
//! A backend stores each attribute under its name as given; names compare
//! without regard to ASCII case, as on Windows.

use crate::ntstatus;

/// FILE_NEED_EA (MS-FSCC 2.4.15): the only flag an attribute may carry.
pub const FILE_NEED_EA: u8 = 0x80;

/// Most bytes a file's attributes may take together, counted as
/// [`ea_list_length`] counts them (MS-FSA 2.1.5.15.5: 64 KiB - 5).
pub const EA_LIST_BYTES_MAX: usize = 64 * 1024 - 5;

/// One extended attribute of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendedAttribute {
    /// 1 to 255 printable ASCII characters, none of `"*+,/:;<=>?[\]|`
    /// ([`valid_ea_name`]).
    pub name: String,
    /// Empty in a change means "remove the attribute".
    pub value: Vec<u8>,
    /// 0 or [`FILE_NEED_EA`].
    pub flags: u8,
}

impl ExtendedAttribute {
    pub fn new(name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            flags: 0,
        }
    }
}

/// Whether `name` is a well-formed EA name (MS-FSCC 2.4.15): 1 to 255
/// characters, none a control character or one of `"*+,/:;<=>?[\]|`.
/// Only printable ASCII is accepted: EA names travel as 8-bit characters
/// whose code page the protocol does not name.
pub fn valid_ea_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .iter()
            .all(|&c| (0x20..0x7F).contains(&c) && !b"\"*+,/:;<=>?[\\]|".contains(&c))
}

/// Why an EA list was refused.
fn inconsistent() -> u32 {
    ntstatus::STATUS_EA_LIST_INCONSISTENT
}

/// Parses a FILE_FULL_EA_INFORMATION list (a CREATE's EA buffer, a SET_INFO
/// of FileFullEaInformation). A list whose entries do not fit, overlap or
/// are not 4-byte aligned, or a name without its terminating NUL, is
/// STATUS_EA_LIST_INCONSISTENT; a name that is not well-formed or flags
/// other than 0 and FILE_NEED_EA STATUS_INVALID_EA_NAME. Nothing is applied
/// unless the whole list parses.
pub fn parse_full_ea_list(buf: &[u8]) -> Result<Vec<ExtendedAttribute>, u32> {
    let mut out = Vec::new();
    let mut at = 0usize;
    loop {
        let entry = buf.get(at..).ok_or_else(inconsistent)?;
        if entry.len() < 8 {
            return Err(inconsistent());
        }
        let next = u32::from_le_bytes(entry[0..4].try_into().expect("4 bytes")) as usize;
        let flags = entry[4];
        let name_len = entry[5] as usize;
        let value_len = u16::from_le_bytes([entry[6], entry[7]]) as usize;
        let size = 8 + name_len + 1 + value_len;
        if entry.len() < size || entry[8 + name_len] != 0 {
            return Err(inconsistent());
        }
        if next != 0 && (next < size || !next.is_multiple_of(4) || next >= entry.len()) {
            return Err(inconsistent());
        }
        let name = &entry[8..8 + name_len];
        if !valid_ea_name(name) || flags & !FILE_NEED_EA != 0 {
            return Err(ntstatus::STATUS_INVALID_EA_NAME);
        }
        out.push(ExtendedAttribute {
            name: String::from_utf8(name.to_vec()).expect("ASCII checked"),
            value: entry[8 + name_len + 1..size].to_vec(),
            flags,
        });
        if next == 0 {
            return Ok(out);
        }
        at += next;
    }
}

/// Parses a FILE_GET_EA_INFORMATION list (the input buffer of a
/// FileFullEaInformation query): the names asked for, in order.
pub fn parse_get_ea_list(buf: &[u8]) -> Result<Vec<String>, u32> {
    let mut out = Vec::new();
    let mut at = 0usize;
    loop {
        let entry = buf.get(at..).ok_or_else(inconsistent)?;
        if entry.len() < 5 {
            return Err(inconsistent());
        }
        let next = u32::from_le_bytes(entry[0..4].try_into().expect("4 bytes")) as usize;
        let name_len = entry[4] as usize;
        let size = 5 + name_len + 1;
        if entry.len() < size || entry[5 + name_len] != 0 {
            return Err(inconsistent());
        }
        if next != 0 && (next < size || !next.is_multiple_of(4) || next >= entry.len()) {
            return Err(inconsistent());
        }
        let name = &entry[5..5 + name_len];
        if !valid_ea_name(name) {
            return Err(ntstatus::STATUS_INVALID_EA_NAME);
        }
        out.push(String::from_utf8(name.to_vec()).expect("ASCII checked"));
        if next == 0 {
            return Ok(out);
        }
        at += next;
    }
}

/// Open.File.ExtendedAttributesLength (MS-FSA): each attribute as the object
/// store packs it, a 4-byte header, the name, its NUL and the value.
pub fn ea_list_length(eas: &[ExtendedAttribute]) -> usize {
    eas.iter()
        .map(|ea| 4 + ea.name.len() + 1 + ea.value.len())
        .sum()
}

/// EaSize of FileEaInformation and FileAllInformation (MS-FSA 2.1.5.12.10):
/// the list's length plus 4 for its header, 0 without attributes.
pub fn ea_size(eas: &[ExtendedAttribute]) -> u32 {
    match ea_list_length(eas) {
        0 => 0,
        n => (n + 4) as u32,
    }
}

/// `eas` with `changes` applied as MS-FSA 2.1.5.15.5 applies a set: an
/// attribute of the same name (any case) goes, and one with a value takes
/// its place at the end.
pub fn merged(eas: &[ExtendedAttribute], changes: &[ExtendedAttribute]) -> Vec<ExtendedAttribute> {
    let mut out = eas.to_vec();
    for change in changes {
        out.retain(|ea| !ea.name.eq_ignore_ascii_case(&change.name));
        if !change.value.is_empty() {
            out.push(change.clone());
        }
    }
    out
}

/// One FILE_FULL_EA_INFORMATION entry, NextEntryOffset 0 (set by
/// [`encode_full_ea_list`] when another follows).
fn encode_entry(ea: &ExtendedAttribute) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + ea.name.len() + 1 + ea.value.len());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(ea.flags);
    out.push(ea.name.len() as u8);
    out.extend_from_slice(&(ea.value.len() as u16).to_le_bytes());
    out.extend_from_slice(ea.name.as_bytes());
    out.push(0);
    out.extend_from_slice(&ea.value);
    out
}

/// The entries of `eas`, from the first, that fit in `cap` bytes (at most
/// one if `single`), chained with 4-byte alignment and no padding after the
/// last; and how many that is.
pub fn encode_full_ea_list(
    eas: &[ExtendedAttribute],
    cap: usize,
    single: bool,
) -> (Vec<u8>, usize) {
    let mut out: Vec<u8> = Vec::new();
    let mut last = None;
    let mut count = 0;
    for ea in eas {
        let entry = encode_entry(ea);
        let start = out.len().div_ceil(4) * 4;
        if start + entry.len() > cap {
            break;
        }
        if let Some(last) = last {
            let offset = (start - last) as u32;
            out[last..last + 4].copy_from_slice(&offset.to_le_bytes());
        }
        out.resize(start, 0);
        out.extend_from_slice(&entry);
        last = Some(start);
        count += 1;
        if single {
            break;
        }
    }
    (out, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(eas: &[ExtendedAttribute]) -> Vec<u8> {
        encode_full_ea_list(eas, usize::MAX, false).0
    }

    #[test]
    fn a_list_round_trips_with_aligned_entries() {
        let eas = vec![
            ExtendedAttribute::new("EAONE", "VALUE1"),
            ExtendedAttribute {
                flags: FILE_NEED_EA,
                ..ExtendedAttribute::new("SECONDEA", "ValueTwo")
            },
        ];
        let buf = list(&eas);
        // 8 + 5 + 1 + 6 = 20, already aligned; then 8 + 8 + 1 + 8 = 25.
        assert_eq!(buf.len(), 45);
        assert_eq!(u32::from_le_bytes(buf[0..4].try_into().unwrap()), 20);
        assert_eq!(parse_full_ea_list(&buf).unwrap(), eas);
        // MS-FSA's EaSize: (4 + 5 + 1 + 6) + (4 + 8 + 1 + 8) + 4.
        assert_eq!(ea_size(&eas), 41);
        assert_eq!(ea_size(&[]), 0);
    }

    #[test]
    fn only_whole_entries_fit_and_single_returns_one() {
        let eas = vec![
            ExtendedAttribute::new("A", "xyz"),
            ExtendedAttribute::new("B", "1"),
        ];
        let (buf, n) = encode_full_ea_list(&eas, 14, false);
        assert_eq!((buf.len(), n), (13, 1));
        assert_eq!(encode_full_ea_list(&eas, 12, false).1, 0);
        assert_eq!(encode_full_ea_list(&eas, 100, true).1, 1);
        assert_eq!(encode_full_ea_list(&eas, 100, false).1, 2);
    }

    #[test]
    fn malformed_lists_and_bad_names_are_refused() {
        let good = list(&[
            ExtendedAttribute::new("A", "1"),
            ExtendedAttribute::new("B", "2"),
        ]);
        // Cut short, misaligned, pointing past the end, name without NUL.
        assert_eq!(
            parse_full_ea_list(&good[..good.len() - 1]),
            Err(ntstatus::STATUS_EA_LIST_INCONSISTENT)
        );
        let mut bad = good.clone();
        bad[0] = 13;
        assert_eq!(
            parse_full_ea_list(&bad),
            Err(ntstatus::STATUS_EA_LIST_INCONSISTENT)
        );
        bad[0] = 200;
        assert_eq!(
            parse_full_ea_list(&bad),
            Err(ntstatus::STATUS_EA_LIST_INCONSISTENT)
        );
        let mut bad = good.clone();
        bad[9] = b'x';
        assert_eq!(
            parse_full_ea_list(&bad),
            Err(ntstatus::STATUS_EA_LIST_INCONSISTENT)
        );
        assert_eq!(
            parse_full_ea_list(&[]),
            Err(ntstatus::STATUS_EA_LIST_INCONSISTENT)
        );
        // Names with characters MS-FSCC forbids, empty names, unknown flags.
        for name in ["a*b", "a:b", "a\\b", "a|b", "a[", "\u{1}", ""] {
            let buf = list(&[ExtendedAttribute::new(name, "v")]);
            assert_eq!(
                parse_full_ea_list(&buf),
                Err(ntstatus::STATUS_INVALID_EA_NAME),
                "{name:?}"
            );
        }
        let mut bad = list(&[ExtendedAttribute::new("A", "1")]);
        bad[4] = 0x01;
        assert_eq!(
            parse_full_ea_list(&bad),
            Err(ntstatus::STATUS_INVALID_EA_NAME)
        );
        assert!(valid_ea_name(b"user name.with-dots_1"));
        assert!(!valid_ea_name(&[b'a'; 256]));
    }

    #[test]
    fn a_get_list_names_the_attributes_asked_for() {
        // "A" then "BC", the second entry at offset 8.
        let mut buf = vec![8, 0, 0, 0, 1, b'A', 0, 0];
        buf.extend_from_slice(&[0, 0, 0, 0, 2, b'B', b'C', 0]);
        assert_eq!(parse_get_ea_list(&buf).unwrap(), ["A", "BC"]);
        assert_eq!(
            parse_get_ea_list(&buf[..7]),
            Err(ntstatus::STATUS_EA_LIST_INCONSISTENT)
        );
    }

    #[test]
    fn a_set_replaces_any_case_and_an_empty_value_removes() {
        let eas = vec![
            ExtendedAttribute::new("One", "1"),
            ExtendedAttribute::new("Two", "2"),
        ];
        let after = merged(
            &eas,
            &[
                ExtendedAttribute::new("ONE", "x"),
                ExtendedAttribute::new("two", ""),
            ],
        );
        assert_eq!(after, vec![ExtendedAttribute::new("ONE", "x")]);
    }
}
