//! File and filesystem info-class encoders used by QUERY_INFO, SET_INFO and
//! QUERY_DIRECTORY.
//!
//! Wire encodings per MS-FSCC 2.4 (file info) and MS-FSCC 2.5 (filesystem
//! info).

use crate::backend::{DirEntry, FileInfo};
use crate::utils::utf16le;

// ---------------------------------------------------------------------------
// File info classes (MS-FSCC §2.4)
// ---------------------------------------------------------------------------

pub const FILE_DIRECTORY_INFORMATION: u8 = 0x01;
pub const FILE_FULL_DIRECTORY_INFORMATION: u8 = 0x02;
pub const FILE_BOTH_DIRECTORY_INFORMATION: u8 = 0x03;
pub const FILE_BASIC_INFORMATION: u8 = 0x04;
pub const FILE_STANDARD_INFORMATION: u8 = 0x05;
pub const FILE_INTERNAL_INFORMATION: u8 = 0x06;
pub const FILE_EA_INFORMATION: u8 = 0x07;
pub const FILE_ACCESS_INFORMATION: u8 = 0x08;
pub const FILE_NAME_INFORMATION: u8 = 0x09;
pub const FILE_NAMES_INFORMATION: u8 = 0x0C;
pub const FILE_POSITION_INFORMATION: u8 = 0x0E;
pub const FILE_FULL_EA_INFORMATION: u8 = 0x0F;
pub const FILE_MODE_INFORMATION: u8 = 0x10;
pub const FILE_ALIGNMENT_INFORMATION: u8 = 0x11;
pub const FILE_ALL_INFORMATION: u8 = 0x12;
pub const FILE_ALLOCATION_INFORMATION: u8 = 0x13;
pub const FILE_END_OF_FILE_INFORMATION: u8 = 0x14;
pub const FILE_ALTERNATE_NAME_INFORMATION: u8 = 0x15;
pub const FILE_STREAM_INFORMATION: u8 = 0x16;
pub const FILE_DISPOSITION_INFORMATION: u8 = 0x0D;
pub const FILE_RENAME_INFORMATION: u8 = 0x0A;
pub const FILE_LINK_INFORMATION: u8 = 0x0B;
pub const FILE_COMPRESSION_INFORMATION: u8 = 0x1C;
pub const FILE_NETWORK_OPEN_INFORMATION: u8 = 0x22;
pub const FILE_ATTRIBUTE_TAG_INFORMATION: u8 = 0x23;
pub const FILE_ID_BOTH_DIRECTORY_INFORMATION: u8 = 0x25;
pub const FILE_ID_FULL_DIRECTORY_INFORMATION: u8 = 0x26;
pub const FILE_NORMALIZED_NAME_INFORMATION: u8 = 0x30;

// ---------------------------------------------------------------------------
// FileBasicInformation (MS-FSCC §2.4.7) - 40 bytes
// ---------------------------------------------------------------------------

pub fn encode_file_basic_information(info: &FileInfo) -> Vec<u8> {
    let mut out = Vec::with_capacity(40);
    out.extend_from_slice(&info.creation_time.to_le_bytes());
    out.extend_from_slice(&info.last_access_time.to_le_bytes());
    out.extend_from_slice(&info.last_write_time.to_le_bytes());
    out.extend_from_slice(&info.change_time.to_le_bytes());
    out.extend_from_slice(&info.attributes().to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // Reserved
    out
}

// ---------------------------------------------------------------------------
// FileStandardInformation (MS-FSCC §2.4.41) - 24 bytes
// ---------------------------------------------------------------------------

/// `links` is the file's link count. NumberOfLinks leaves out the link being
/// deleted when `delete_pending` (MS-FSA 2.1.5.12.27 counts the links not
/// marked deleted; Samba does the same, and the Linux client shows it as
/// st_nlink, which POSIX wants 0 for an unlinked file still open).
/// DeletePending is set when `delete_pending` is or no link is left.
pub fn encode_file_standard_information(
    info: &FileInfo,
    links: u32,
    delete_pending: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&info.allocation_size.to_le_bytes());
    out.extend_from_slice(&info.end_of_file.to_le_bytes());
    let links = if delete_pending { links.saturating_sub(1) } else { links };
    out.extend_from_slice(&links.to_le_bytes());
    out.push(u8::from(delete_pending || links == 0));
    out.push(if info.is_directory { 1 } else { 0 }); // Directory
    out.extend_from_slice(&0u16.to_le_bytes()); // Reserved
    out
}

// ---------------------------------------------------------------------------
// FileInternalInformation (MS-FSCC §2.4.20) - 8 bytes
// ---------------------------------------------------------------------------

pub fn encode_file_internal_information(file_index: u64) -> Vec<u8> {
    file_index.to_le_bytes().to_vec()
}

// ---------------------------------------------------------------------------
// FileEaInformation (MS-FSCC §2.4.12) - 4 bytes
// ---------------------------------------------------------------------------

/// `ea_size` as MS-FSA 2.1.5.12.10 counts it (Aquifer patch; upstream 0).
pub fn encode_file_ea_information(ea_size: u32) -> Vec<u8> {
    ea_size.to_le_bytes().to_vec()
}

/// FILE_NAME_INFORMATION (MS-FSCC 2.1.7) holding `name`: FileAlternateNameInformation and
/// FileNormalizedNameInformation (Aquifer patch).
pub fn encode_file_name_information(name: &str) -> Vec<u8> {
    let name = utf16le(name);
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&name);
    out
}

// ---------------------------------------------------------------------------
// FileAccessInformation (MS-FSCC §2.4.1) - 4 bytes
// ---------------------------------------------------------------------------

pub fn encode_file_access_information(access_mask: u32) -> Vec<u8> {
    access_mask.to_le_bytes().to_vec()
}

// ---------------------------------------------------------------------------
// FilePositionInformation (MS-FSCC §2.4.32) - 8 bytes
// ---------------------------------------------------------------------------

/// Aquifer patch: the open's CurrentByteOffset (upstream always 0).
pub fn encode_file_position_information(position: u64) -> Vec<u8> {
    position.to_le_bytes().to_vec()
}

/// FileCompressionInformation (MS-FSCC §2.4.9) - 16 bytes (Aquifer patch).
/// Nothing here is stored compressed (MS-FSA 2.1.5.12.7): CompressedFileSize
/// is the file's size (0 for a directory), CompressionFormat
/// COMPRESSION_FORMAT_NONE and the shifts 0.
pub fn encode_file_compression_information(info: &FileInfo) -> Vec<u8> {
    let size = if info.is_directory { 0 } else { info.end_of_file };
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // CompressionFormat
    out.resize(16, 0); // CompressionUnitShift, ChunkShift, ClusterShift, Reserved
    out
}

/// FileAttributeTagInformation (MS-FSCC §2.4.6) - 8 bytes (Aquifer patch):
/// the attributes and ReparseTag 0, since no file here is a reparse point.
pub fn encode_file_attribute_tag_information(info: &FileInfo) -> Vec<u8> {
    let mut out = Vec::with_capacity(8);
    out.extend_from_slice(&info.attributes().to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

// ---------------------------------------------------------------------------
// FileModeInformation (MS-FSCC §2.4.24) - 4 bytes
// ---------------------------------------------------------------------------

pub fn encode_file_mode_information(mode: u32) -> Vec<u8> {
    mode.to_le_bytes().to_vec()
}

// ---------------------------------------------------------------------------
// FileAlignmentInformation (MS-FSCC §2.4.3) - 4 bytes
// ---------------------------------------------------------------------------

pub fn encode_file_alignment_information() -> Vec<u8> {
    // FILE_BYTE_ALIGNMENT (0) - no alignment requirement.
    0u32.to_le_bytes().to_vec()
}

// ---------------------------------------------------------------------------
// FileAllInformation (MS-FSCC §2.4.2) - concatenation of basic, standard,
// internal, EA, access, position, mode, alignment, name.
// ---------------------------------------------------------------------------

/// `name` is the open's path from the share's root, with a leading
/// backslash, as Windows and Samba report it (MS-FSA 2.1.5.12.1; Aquifer
/// patch: upstream left the name empty).
pub fn encode_file_all_information(
    info: &FileInfo,
    access_mask: u32,
    links: u32,
    delete_pending: bool,
    position: u64,
    ea_size: u32,
    name: &str,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&encode_file_basic_information(info));
    out.extend_from_slice(&encode_file_standard_information(
        info,
        links,
        delete_pending,
    ));
    out.extend_from_slice(&encode_file_internal_information(info.file_index));
    out.extend_from_slice(&encode_file_ea_information(ea_size));
    out.extend_from_slice(&encode_file_access_information(access_mask));
    out.extend_from_slice(&encode_file_position_information(position));
    out.extend_from_slice(&encode_file_mode_information(0));
    out.extend_from_slice(&encode_file_alignment_information());
    let name = utf16le(name);
    out.extend_from_slice(&(name.len() as u32).to_le_bytes()); // FileNameLength
    out.extend_from_slice(&name);
    // Linux cifs checks FileAllInformation against its struct with
    // FileName[1], so an empty name still takes one byte.
    if name.is_empty() {
        out.push(0);
    }
    out
}

// ---------------------------------------------------------------------------
// FileNetworkOpenInformation (MS-FSCC §2.4.30) - 56 bytes
// ---------------------------------------------------------------------------

pub fn encode_file_network_open_information(info: &FileInfo) -> Vec<u8> {
    let mut out = Vec::with_capacity(56);
    out.extend_from_slice(&info.creation_time.to_le_bytes());
    out.extend_from_slice(&info.last_access_time.to_le_bytes());
    out.extend_from_slice(&info.last_write_time.to_le_bytes());
    out.extend_from_slice(&info.change_time.to_le_bytes());
    out.extend_from_slice(&info.allocation_size.to_le_bytes());
    out.extend_from_slice(&info.end_of_file.to_le_bytes());
    out.extend_from_slice(&info.attributes().to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // Reserved
    out
}

// ---------------------------------------------------------------------------
// FileStreamInformation (MS-FSCC §2.4.43) - for non-directories, one default
// stream entry (`::$DATA`); for directories, empty buffer.
// ---------------------------------------------------------------------------

pub fn encode_file_stream_information(info: &FileInfo) -> Vec<u8> {
    if info.is_directory {
        return Vec::new();
    }
    let stream_name = utf16le("::$DATA");
    let stream_name_len = stream_name.len() as u32;
    let mut out = Vec::new();
    out.extend_from_slice(&0u32.to_le_bytes()); // NextEntryOffset = 0
    out.extend_from_slice(&stream_name_len.to_le_bytes()); // StreamNameLength
    out.extend_from_slice(&info.end_of_file.to_le_bytes()); // StreamSize
    out.extend_from_slice(&info.allocation_size.to_le_bytes()); // StreamAllocationSize
    out.extend_from_slice(&stream_name);
    out
}

// ---------------------------------------------------------------------------
// FS info classes (MS-FSCC §2.5)
// ---------------------------------------------------------------------------

pub const FS_VOLUME_INFORMATION: u8 = 0x01;
pub const FS_SIZE_INFORMATION: u8 = 0x03;
pub const FS_DEVICE_INFORMATION: u8 = 0x04;
pub const FS_ATTRIBUTE_INFORMATION: u8 = 0x05;
pub const FS_CONTROL_INFORMATION: u8 = 0x06;
pub const FS_FULL_SIZE_INFORMATION: u8 = 0x07;
pub const FS_OBJECT_ID_INFORMATION: u8 = 0x08;
pub const FS_SECTOR_SIZE_INFORMATION: u8 = 0x0B;

/// Volume serial number of a backend that reports none of its own.
pub const VOLUME_SERIAL_NUMBER: u32 = 0xCAFE_BABE;

/// FileFsVolumeInformation (MS-FSCC §2.5.9). Volume creation time, serial,
/// label.
pub fn encode_fs_volume_information(creation_time: u64, serial: u32, label: &str) -> Vec<u8> {
    let label_u16 = utf16le(label);
    let mut out = Vec::new();
    out.extend_from_slice(&creation_time.to_le_bytes());
    out.extend_from_slice(&serial.to_le_bytes());
    out.extend_from_slice(&(label_u16.len() as u32).to_le_bytes());
    out.push(0); // SupportsObjects
    out.push(0); // Reserved
    out.extend_from_slice(&label_u16);
    out
}

/// FileFsSizeInformation (MS-FSCC §2.5.7) - 24 bytes.
pub fn encode_fs_size_information(
    total_alloc_units: u64,
    avail_alloc_units: u64,
    sectors_per_unit: u32,
    bytes_per_sector: u32,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&total_alloc_units.to_le_bytes());
    out.extend_from_slice(&avail_alloc_units.to_le_bytes());
    out.extend_from_slice(&sectors_per_unit.to_le_bytes());
    out.extend_from_slice(&bytes_per_sector.to_le_bytes());
    out
}

/// FileFsDeviceInformation (MS-FSCC §2.5.10) - 8 bytes.
pub fn encode_fs_device_information(device_type: u32, characteristics: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(8);
    out.extend_from_slice(&device_type.to_le_bytes());
    out.extend_from_slice(&characteristics.to_le_bytes());
    out
}

/// FileFsAttributeInformation (MS-FSCC §2.5.1) - variable.
pub fn encode_fs_attribute_information(
    attributes: u32,
    max_component_len: u32,
    fs_name: &str,
) -> Vec<u8> {
    let name_u16 = utf16le(fs_name);
    let mut out = Vec::new();
    out.extend_from_slice(&attributes.to_le_bytes());
    out.extend_from_slice(&max_component_len.to_le_bytes());
    out.extend_from_slice(&(name_u16.len() as u32).to_le_bytes());
    out.extend_from_slice(&name_u16);
    out
}

/// FileFsFullSizeInformation (MS-FSCC §2.5.4) - 32 bytes.
pub fn encode_fs_full_size_information(
    total_alloc_units: u64,
    caller_avail_alloc_units: u64,
    actual_avail_alloc_units: u64,
    sectors_per_unit: u32,
    bytes_per_sector: u32,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&total_alloc_units.to_le_bytes());
    out.extend_from_slice(&caller_avail_alloc_units.to_le_bytes());
    out.extend_from_slice(&actual_avail_alloc_units.to_le_bytes());
    out.extend_from_slice(&sectors_per_unit.to_le_bytes());
    out.extend_from_slice(&bytes_per_sector.to_le_bytes());
    out
}

/// FileFsSectorSizeInformation (MS-FSCC §2.5.8) - 28 bytes. Every sector
/// size is `bytes_per_sector`, and the device and partition are reported
/// aligned.
pub fn encode_fs_sector_size_information(bytes_per_sector: u32) -> Vec<u8> {
    const SSINFO_FLAGS_ALIGNED_DEVICE: u32 = 0x0000_0001;
    const SSINFO_FLAGS_PARTITION_ALIGNED_ON_DEVICE: u32 = 0x0000_0002;
    let mut out = Vec::with_capacity(28);
    for _ in 0..4 {
        out.extend_from_slice(&bytes_per_sector.to_le_bytes());
    }
    let flags = SSINFO_FLAGS_ALIGNED_DEVICE | SSINFO_FLAGS_PARTITION_ALIGNED_ON_DEVICE;
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // ByteOffsetForSectorAlignment
    out.extend_from_slice(&0u32.to_le_bytes()); // ByteOffsetForPartitionAlignment
    out
}

/// FileFsControlInformation (MS-FSCC §2.5.2) - 48 bytes, for a volume
/// without quotas (Aquifer patch): no free-space filtering, default quota
/// threshold and limit "none" (all ones), FileSystemControlFlags 0 (quotas
/// neither tracked nor enforced).
pub fn encode_fs_control_information() -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    for _ in 0..3 {
        out.extend_from_slice(&0u64.to_le_bytes()); // FreeSpace{Start,Threshold,Stop}Filtering
    }
    out.extend_from_slice(&u64::MAX.to_le_bytes()); // DefaultQuotaThreshold
    out.extend_from_slice(&u64::MAX.to_le_bytes()); // DefaultQuotaLimit
    out.extend_from_slice(&0u32.to_le_bytes()); // FileSystemControlFlags
    out.extend_from_slice(&0u32.to_le_bytes()); // Padding
    out
}

/// FileFsObjectIdInformation (MS-FSCC §2.5.6) - 64 bytes (Aquifer patch):
/// the volume's 16-byte object id and 48 bytes of ExtendedInfo, which this
/// server leaves zero.
pub fn encode_fs_object_id_information(object_id: [u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&object_id);
    out.resize(64, 0);
    out
}

// ---------------------------------------------------------------------------
// Directory information classes (MS-FSCC §2.4.{8,14,17,30,31})
// ---------------------------------------------------------------------------

/// Encode one directory entry in info class `class`; empty for unsupported
/// classes. The caller patches `NextEntryOffset` for chained entries.
pub fn encode_dir_entry(class: u8, entry: &DirEntry) -> Vec<u8> {
    let info = &entry.info;
    let name_u16 = utf16le(&info.name);
    match class {
        FILE_DIRECTORY_INFORMATION => {
            // 64 bytes fixed + name
            let mut out = Vec::new();
            write_dir_entry_prefix(&mut out, info, name_u16.len());
            out.extend_from_slice(&name_u16);
            out
        }
        FILE_FULL_DIRECTORY_INFORMATION => {
            let mut out = Vec::new();
            write_dir_entry_prefix(&mut out, info, name_u16.len());
            out.extend_from_slice(&0u32.to_le_bytes()); // EaSize
            out.extend_from_slice(&name_u16);
            out
        }
        FILE_BOTH_DIRECTORY_INFORMATION => {
            let mut out = Vec::new();
            write_dir_entry_prefix(&mut out, info, name_u16.len());
            out.extend_from_slice(&0u32.to_le_bytes()); // EaSize
            write_short_name(&mut out, &info.name);
            out.extend_from_slice(&name_u16);
            out
        }
        FILE_ID_BOTH_DIRECTORY_INFORMATION => {
            let mut out = Vec::new();
            write_dir_entry_prefix(&mut out, info, name_u16.len());
            out.extend_from_slice(&0u32.to_le_bytes()); // EaSize
            write_short_name(&mut out, &info.name);
            out.extend_from_slice(&0u16.to_le_bytes()); // Reserved2
            out.extend_from_slice(&info.file_index.to_le_bytes()); // FileId
            out.extend_from_slice(&name_u16);
            out
        }
        FILE_ID_FULL_DIRECTORY_INFORMATION => {
            let mut out = Vec::new();
            write_dir_entry_prefix(&mut out, info, name_u16.len());
            out.extend_from_slice(&0u32.to_le_bytes()); // EaSize
            out.extend_from_slice(&0u32.to_le_bytes()); // Reserved
            out.extend_from_slice(&info.file_index.to_le_bytes()); // FileId
            out.extend_from_slice(&name_u16);
            out
        }
        FILE_NAMES_INFORMATION => {
            let mut out = Vec::new();
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(info.file_index as u32).to_le_bytes());
            out.extend_from_slice(&(name_u16.len() as u32).to_le_bytes());
            out.extend_from_slice(&name_u16);
            out
        }
        _ => Vec::new(),
    }
}

/// ShortNameLength, Reserved1 and the 24 bytes of ShortName (Aquifer patch;
/// upstream left them empty): the short name of `name`, none for a name that
/// is an 8.3 name itself, as NTFS and Samba list them.
fn write_short_name(out: &mut Vec<u8>, name: &str) {
    let short = crate::short_name::short_name(name).map(|s| utf16le(&s)).unwrap_or_default();
    debug_assert!(short.len() <= 24, "a short name is at most 12 characters");
    out.push(short.len() as u8);
    out.push(0);
    let at = out.len();
    out.extend_from_slice(&short);
    out.resize(at + 24, 0);
}

fn write_dir_entry_prefix(out: &mut Vec<u8>, info: &FileInfo, name_len: usize) {
    out.extend_from_slice(&0u32.to_le_bytes()); // NextEntryOffset (patched later)
    out.extend_from_slice(&(info.file_index as u32).to_le_bytes()); // FileIndex
    out.extend_from_slice(&info.creation_time.to_le_bytes());
    out.extend_from_slice(&info.last_access_time.to_le_bytes());
    out.extend_from_slice(&info.last_write_time.to_le_bytes());
    out.extend_from_slice(&info.change_time.to_le_bytes());
    out.extend_from_slice(&info.end_of_file.to_le_bytes());
    out.extend_from_slice(&info.allocation_size.to_le_bytes());
    out.extend_from_slice(&info.attributes().to_le_bytes());
    out.extend_from_slice(&(name_len as u32).to_le_bytes());
}

/// Offset of FileName in a directory entry of info class `class`: the size
/// of its fixed part. `None` for classes `encode_dir_entry` does not encode.
pub fn dir_entry_name_offset(class: u8) -> Option<usize> {
    Some(match class {
        FILE_DIRECTORY_INFORMATION => 64,
        FILE_FULL_DIRECTORY_INFORMATION => 68,
        FILE_BOTH_DIRECTORY_INFORMATION => 94,
        FILE_NAMES_INFORMATION => 12,
        FILE_ID_BOTH_DIRECTORY_INFORMATION => 104,
        FILE_ID_FULL_DIRECTORY_INFORMATION => 80,
        _ => return None,
    })
}

/// Round up `n` to the next multiple of 8.
pub fn align8(n: usize) -> usize {
    (n + 7) & !7
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_info() -> FileInfo {
        FileInfo {
            name: "file.txt".to_string(),
            end_of_file: 100,
            allocation_size: 100,
            creation_time: 0x01D9_0000_0000_0000,
            last_access_time: 0x01D9_0000_0000_0000,
            last_write_time: 0x01D9_0000_0000_0000,
            change_time: 0x01D9_0000_0000_0000,
            is_directory: false,
            read_only: false,
            file_index: 1,
            dos_attributes: 0,
        }
    }

    #[test]
    fn basic_information_is_40_bytes() {
        let bytes = encode_file_basic_information(&fake_info());
        assert_eq!(bytes.len(), 40);
    }

    #[test]
    fn standard_information_is_24_bytes() {
        let bytes = encode_file_standard_information(&fake_info(), 1, false);
        assert_eq!(bytes.len(), 24);
    }

    #[test]
    fn standard_information_reports_links_and_delete_pending() {
        let bytes = encode_file_standard_information(&fake_info(), 3, false);
        assert_eq!(bytes[16..20], 3u32.to_le_bytes());
        assert_eq!(bytes[20], 0);
        let pending = encode_file_standard_information(&fake_info(), 1, true);
        assert_eq!(pending[20], 1);
        // The link being deleted is not counted.
        assert_eq!(pending[16..20], 0u32.to_le_bytes());
        assert_eq!(
            encode_file_standard_information(&fake_info(), 3, true)[16..20],
            2u32.to_le_bytes()
        );
        // No link left: the file is being deleted.
        assert_eq!(
            encode_file_standard_information(&fake_info(), 0, false)[20],
            1
        );
    }

    #[test]
    fn network_open_information_is_56_bytes() {
        let bytes = encode_file_network_open_information(&fake_info());
        assert_eq!(bytes.len(), 56);
    }

    #[test]
    fn file_all_information_empty_name_keeps_linux_minimum_size() {
        let bytes = encode_file_all_information(&fake_info(), 0x001F_01FF, 1, false, 0, 0, "");
        assert_eq!(bytes.len(), 101);
        // FileNameLength
        assert_eq!(bytes[96..100], [0; 4]);
    }

    #[test]
    fn file_all_information_ends_with_the_name() {
        let bytes =
            encode_file_all_information(&fake_info(), 0x001F_01FF, 1, false, 0, 0, "\\d\\f.txt");
        assert_eq!(bytes[96..100], 16u32.to_le_bytes());
        assert_eq!(bytes[100..], utf16le("\\d\\f.txt"));
    }

    #[test]
    fn dir_entry_name_offsets_match_the_encoders() {
        let entry = DirEntry { info: fake_info() };
        let name_len = utf16le(&entry.info.name).len();
        for class in [
            FILE_DIRECTORY_INFORMATION,
            FILE_FULL_DIRECTORY_INFORMATION,
            FILE_BOTH_DIRECTORY_INFORMATION,
            FILE_NAMES_INFORMATION,
            FILE_ID_BOTH_DIRECTORY_INFORMATION,
            FILE_ID_FULL_DIRECTORY_INFORMATION,
        ] {
            let offset = dir_entry_name_offset(class).unwrap();
            assert_eq!(encode_dir_entry(class, &entry).len(), offset + name_len);
        }
        assert_eq!(dir_entry_name_offset(0x3C), None);
    }

    #[test]
    fn sector_size_information_is_28_bytes() {
        let bytes = encode_fs_sector_size_information(4096);
        assert_eq!(bytes.len(), 28);
        assert_eq!(bytes[0..4], 4096u32.to_le_bytes());
    }

    #[test]
    fn both_directory_listings_carry_the_short_name_of_a_long_name() {
        let long = DirEntry {
            info: FileInfo {
                name: "A long name.text".to_string(),
                ..fake_info()
            },
        };
        let short = crate::short_name::short_name("A long name.text").unwrap();
        for (class, at) in [
            (FILE_BOTH_DIRECTORY_INFORMATION, 68),
            (FILE_ID_BOTH_DIRECTORY_INFORMATION, 68),
        ] {
            let bytes = encode_dir_entry(class, &long);
            let units = utf16le(&short);
            assert_eq!(bytes[at] as usize, units.len(), "ShortNameLength");
            assert_eq!(bytes[at + 2..at + 2 + units.len()], units[..]);
            assert!(bytes[at + 2 + units.len()..at + 26].iter().all(|&b| b == 0));
            assert_eq!(bytes.len(), dir_entry_name_offset(class).unwrap() + utf16le("A long name.text").len());
            // A name that is 8.3 itself has no other short name.
            let plain = encode_dir_entry(class, &DirEntry { info: fake_info() });
            assert_eq!(plain[at], 0);
        }
    }
}
