//! The NT quota fake file (Aquifer patch).
//!
//! Windows clients read and set per-user quotas through the file
//! `$Extend\$Quota:$Q:$INDEX_ALLOCATION` at the root of an NTFS volume:
//! QUERY_INFO and SET_INFO with SMB2_0_INFO_QUOTA on an open of it (MS-SMB2
//! 3.3.5.20.4, 3.3.5.21.4). Samba answers a CREATE of that name, at the root
//! of the share only, with an open of a file that exists nowhere: attributes
//! HIDDEN, SYSTEM, DIRECTORY and ARCHIVE, every time zero, no share modes,
//! leases or oplocks. The server does the same, without asking the backend:
//! no backend here keeps per-user quotas, so every quota query that parses
//! answers STATUS_NO_MORE_ENTRIES (no entries, as Samba answers when no user
//! has a quota; no numbers are made up) and every quota set is
//! STATUS_NOT_SUPPORTED, as for any other open (MS-SMB2 3.3.5.21.4, store
//! without quotas). Nothing else about the fake file can be changed.

use async_trait::async_trait;

use crate::backend::{
    DirEntry, FILE_ATTRIBUTE_ARCHIVE, FILE_ATTRIBUTE_HIDDEN, FILE_ATTRIBUTE_SYSTEM, FileInfo,
    FileTimes, Handle,
};
use crate::error::{SmbError, SmbResult};
use crate::ntstatus;
use crate::security::Sid;

/// The name a CREATE gives to open the quota fake file: exactly this, from
/// the share's root, as Windows and Samba's clients send it.
pub(crate) const FAKE_FILE_NAME: &str = "$Extend\\$Quota:$Q:$INDEX_ALLOCATION";

/// Whether the CREATE name `units` (UTF-16, as on the wire) names the quota
/// fake file. Names differing in case, with a stream type of another case,
/// or below a directory do not: they go through the usual checks (a name
/// with a stream is STATUS_OBJECT_NAME_INVALID, as before).
pub(crate) fn is_fake_file_name(units: &[u16]) -> bool {
    units.iter().copied().eq(FAKE_FILE_NAME.encode_utf16())
}

/// What the fake file reports: a directory (an index) with HIDDEN, SYSTEM
/// and ARCHIVE, no size, every time zero, no file id.
pub(crate) fn fake_file_info() -> FileInfo {
    let mut info = FileInfo::new("$Quota");
    info.is_directory = true;
    info.dos_attributes = FILE_ATTRIBUTE_HIDDEN | FILE_ATTRIBUTE_SYSTEM | FILE_ATTRIBUTE_ARCHIVE;
    info
}

/// The handle of an open of the fake file. It reads as an empty index and
/// refuses every change.
pub(crate) struct FakeFileHandle;

#[async_trait]
impl Handle for FakeFileHandle {
    /// A READ of it is one of a directory (STATUS_INVALID_DEVICE_REQUEST).
    async fn read(&self, _offset: u64, _len: u32) -> SmbResult<bytes::Bytes> {
        Err(SmbError::IsDirectory)
    }

    async fn write(&self, _offset: u64, _data: &[u8]) -> SmbResult<u32> {
        Err(SmbError::AccessDenied)
    }

    async fn flush(&self) -> SmbResult<()> {
        Ok(())
    }

    async fn stat(&self) -> SmbResult<FileInfo> {
        Ok(fake_file_info())
    }

    async fn set_times(&self, _times: FileTimes) -> SmbResult<()> {
        Err(SmbError::AccessDenied)
    }

    async fn set_attributes(&self, _attributes: u32) -> SmbResult<()> {
        Err(SmbError::AccessDenied)
    }

    async fn truncate(&self, _len: u64) -> SmbResult<()> {
        Err(SmbError::AccessDenied)
    }

    /// The quota index is read through quota queries, not listed.
    async fn list_dir(&self, _pattern: Option<&str>) -> SmbResult<Vec<DirEntry>> {
        Err(SmbError::NotSupported)
    }

    async fn dir_entry(&self, _name: &str) -> SmbResult<Option<DirEntry>> {
        Err(SmbError::NotSupported)
    }

    async fn close(self: Box<Self>) -> SmbResult<()> {
        Ok(())
    }
}

/// Size of SMB2_QUERY_QUOTA_INFO before its SidBuffer (MS-SMB2 2.2.37.1):
/// ReturnSingle, RestartScan, Reserved, SidListLength, StartSidLength and
/// StartSidOffset.
const QUERY_QUOTA_INFO_LEN: usize = 16;

/// Size of FILE_GET_QUOTA_INFORMATION before its Sid (MS-FSCC 2.4.41.1):
/// NextEntryOffset and SidLength.
const GET_QUOTA_INFO_LEN: usize = 8;

/// Answers a QUERY_INFO with SMB2_0_INFO_QUOTA on the fake file, whose
/// InputBuffer is `input` (MS-SMB2 3.3.5.20.4): the status of the reply,
/// which carries no data. An InputBuffer that is not an
/// SMB2_QUERY_QUOTA_INFO, a SidList that is not a chain of
/// FILE_GET_QUOTA_INFORMATION entries each holding one whole SID, or a
/// StartSid that does not lie whole within the SidBuffer, is
/// STATUS_INVALID_PARAMETER. A request that parses gets
/// STATUS_NO_MORE_ENTRIES: there is no quota entry for any SID. (Where a
/// store keeps quotas, MS-SMB2 has a listed SID without an entry answered
/// with zeros; here that would read as a limit of zero bytes, which no user
/// has, so no entry is returned, as Samba answers for users without a
/// quota.)
pub(crate) fn query(input: &[u8]) -> u32 {
    match check_query(input) {
        Ok(()) => ntstatus::STATUS_NO_MORE_ENTRIES,
        Err(status) => status,
    }
}

fn check_query(input: &[u8]) -> Result<(), u32> {
    let invalid = ntstatus::STATUS_INVALID_PARAMETER;
    let (fixed, sid_buffer) = input
        .split_first_chunk::<QUERY_QUOTA_INFO_LEN>()
        .ok_or(invalid)?;
    let u32_at =
        |at: usize| u32::from_le_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]]);
    let sid_list_length = u32_at(4) as usize;
    let start_sid_length = u32_at(8) as usize;
    let start_sid_offset = u32_at(12) as usize;
    if sid_list_length != 0 {
        // MS-SMB2 3.3.5.20.4: with a SidList, StartSid is ignored.
        let list = sid_buffer.get(..sid_list_length).ok_or(invalid)?;
        return check_sid_list(list);
    }
    if start_sid_length != 0 {
        let end = start_sid_offset
            .checked_add(start_sid_length)
            .ok_or(invalid)?;
        let sid = sid_buffer.get(start_sid_offset..end).ok_or(invalid)?;
        return check_sid(sid);
    }
    Ok(())
}

/// Checks a chain of FILE_GET_QUOTA_INFORMATION entries filling `list`:
/// each entry whole, 4-byte aligned, its SidLength the length of the one
/// SID it holds, and NextEntryOffset 0 on the last one and past the SID
/// on the others.
fn check_sid_list(list: &[u8]) -> Result<(), u32> {
    let invalid = ntstatus::STATUS_INVALID_PARAMETER;
    let mut at = 0usize;
    loop {
        let entry = &list[at..];
        let header = entry.first_chunk::<GET_QUOTA_INFO_LEN>().ok_or(invalid)?;
        let next = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let sid_length = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        let sid_end = GET_QUOTA_INFO_LEN.checked_add(sid_length).ok_or(invalid)?;
        check_sid(entry.get(GET_QUOTA_INFO_LEN..sid_end).ok_or(invalid)?)?;
        if next == 0 {
            return Ok(());
        }
        if next < sid_end || next % 4 != 0 || next >= entry.len() {
            return Err(invalid);
        }
        at += next;
    }
}

/// Checks that `bytes` is exactly one SID (MS-DTYP 2.4.2.2).
fn check_sid(bytes: &[u8]) -> Result<(), u32> {
    match Sid::parse(bytes) {
        Ok((_, len)) if len == bytes.len() => Ok(()),
        _ => Err(ntstatus::STATUS_INVALID_PARAMETER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `S-1-22-1-<uid>`, 16 bytes.
    fn sid(uid: u32) -> Vec<u8> {
        let mut out = vec![1, 2, 0, 0, 0, 0, 0, 22];
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&uid.to_le_bytes());
        out
    }

    fn request(sid_list_length: u32, start_sid_length: u32, start_sid_offset: u32) -> Vec<u8> {
        let mut out = vec![0, 1, 0, 0];
        out.extend_from_slice(&sid_list_length.to_le_bytes());
        out.extend_from_slice(&start_sid_length.to_le_bytes());
        out.extend_from_slice(&start_sid_offset.to_le_bytes());
        out
    }

    fn entry(next: u32, sid: &[u8]) -> Vec<u8> {
        let mut out = next.to_le_bytes().to_vec();
        out.extend_from_slice(&(sid.len() as u32).to_le_bytes());
        out.extend_from_slice(sid);
        out
    }

    fn with_list(list: &[u8]) -> Vec<u8> {
        let mut out = request(list.len() as u32, 0, 0);
        out.extend_from_slice(list);
        out
    }

    const NONE: u32 = ntstatus::STATUS_NO_MORE_ENTRIES;
    const BAD: u32 = ntstatus::STATUS_INVALID_PARAMETER;

    #[test]
    fn only_the_exact_name_is_the_fake_file() {
        let units = |s: &str| s.encode_utf16().collect::<Vec<u16>>();
        assert!(is_fake_file_name(&units(
            "$Extend\\$Quota:$Q:$INDEX_ALLOCATION"
        )));
        for other in [
            "$extend\\$quota:$Q:$INDEX_ALLOCATION",
            "dir\\$Extend\\$Quota:$Q:$INDEX_ALLOCATION",
            "$Extend\\$Quota",
            "$Extend\\$Quota:$Q:$INDEX_ALLOCATIONx",
            "$Extend/$Quota:$Q:$INDEX_ALLOCATION",
            "",
        ] {
            assert!(!is_fake_file_name(&units(other)), "{other}");
        }
    }

    #[test]
    fn the_fake_file_is_a_hidden_system_directory_with_no_times() {
        let info = fake_file_info();
        assert_eq!(info.attributes(), 0x2 | 0x4 | 0x10 | 0x20);
        assert_eq!(
            [
                info.creation_time,
                info.last_access_time,
                info.last_write_time,
                info.change_time,
                info.end_of_file,
                info.allocation_size,
            ],
            [0; 6]
        );
    }

    #[test]
    fn well_formed_queries_find_no_entries() {
        // A scan of every entry.
        assert_eq!(query(&request(0, 0, 0)), NONE);
        // Entries for a list of SIDs, the second one 4-byte aligned.
        let first = entry(24, &sid(0));
        assert_eq!(first.len(), 24);
        let list = [first, entry(0, &sid(1000))].concat();
        assert_eq!(query(&with_list(&list)), NONE);
        // A scan from a SID, at an offset in the SidBuffer.
        let mut start = request(0, 16, 4);
        start.extend_from_slice(&[0; 4]);
        start.extend_from_slice(&sid(7));
        assert_eq!(query(&start), NONE);
        // With a SidList the StartSid fields are ignored.
        let mut list = with_list(&entry(0, &sid(1)));
        list[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(query(&list), NONE);
    }

    #[test]
    fn malformed_queries_are_invalid_parameters() {
        // Shorter than SMB2_QUERY_QUOTA_INFO.
        for len in 0..QUERY_QUOTA_INFO_LEN {
            assert_eq!(query(&request(0, 0, 0)[..len]), BAD, "{len} bytes");
        }
        // A SidList longer than the buffer.
        let list = entry(0, &sid(1));
        let mut long = with_list(&list);
        long[4..8].copy_from_slice(&(list.len() as u32 + 1).to_le_bytes());
        assert_eq!(query(&long), BAD);
        long[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(query(&long), BAD);
        // SidLength past the list, shorter or longer than the SID, zero.
        for sid_length in [17u32, 15, 20, 0, u32::MAX] {
            let mut bad = list.clone();
            bad[4..8].copy_from_slice(&sid_length.to_le_bytes());
            bad.resize(bad.len().max(8 + sid_length.min(64) as usize), 0);
            assert_eq!(query(&with_list(&bad)), BAD, "SidLength {sid_length}");
        }
        // A list too short for one entry's header.
        assert_eq!(query(&with_list(&[0; 7])), BAD);
        // NextEntryOffset inside the entry, unaligned, past the list, or
        // wrapping around.
        let second = entry(0, &sid(2));
        for next in [8u32, 23, 26, 32 + second.len() as u32, u32::MAX] {
            let list = [entry(next, &sid(1)), vec![0; 8], second.clone()].concat();
            assert_eq!(query(&with_list(&list)), BAD, "NextEntryOffset {next}");
        }
        // Not a SID: revision 2, or more sub-authorities than it holds.
        let mut revision = sid(1);
        revision[0] = 2;
        assert_eq!(query(&with_list(&entry(0, &revision))), BAD);
        let mut count = sid(1);
        count[1] = 3;
        assert_eq!(query(&with_list(&entry(0, &count))), BAD);
        let mut many = sid(1);
        many[1] = 16;
        many.resize(8 + 4 * 16, 0);
        assert_eq!(query(&with_list(&entry(0, &many))), BAD);
        // A StartSid outside the SidBuffer, or not exactly one SID.
        let mut start = request(0, 16, 4);
        start.extend_from_slice(&sid(7));
        assert_eq!(query(&start), BAD);
        let mut wrap = request(0, 16, u32::MAX);
        wrap.extend_from_slice(&sid(7));
        assert_eq!(query(&wrap), BAD);
        let mut short = request(0, 12, 0);
        short.extend_from_slice(&sid(7));
        assert_eq!(query(&short), BAD);
    }

    #[test]
    fn random_buffers_never_panic() {
        // A small deterministic generator: the check must answer every
        // buffer, never panic.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = (next() % 80) as usize;
            let mut buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if len >= QUERY_QUOTA_INFO_LEN && next() % 2 == 0 {
                // Lengths that mostly fit, so the list parser runs.
                let rest = (len - QUERY_QUOTA_INFO_LEN) as u32;
                let pick = (next() % u64::from(rest + 1)) as u32;
                buf[4..8].copy_from_slice(&pick.to_le_bytes());
            }
            let status = query(&buf);
            assert!(status == NONE || status == BAD);
        }
    }
}
