//! QUERY_INFO handler (MS-SMB2 3.3.5.20).

use std::sync::Arc;

use crate::proto::header::Smb2Header;
use crate::proto::messages::{Dialect, InfoType, QueryInfoRequest, QueryInfoResponse};

use std::sync::atomic::Ordering;

use crate::access_mask::READ_CONTROL;
use crate::backend::Handle;
use crate::ea::{self, ExtendedAttribute};
use crate::short_name;
use crate::conn::state::{Connection, Open};
use crate::dispatch::HandlerResponse;
use crate::error::SmbError;
use crate::handlers::shared::{lookup_open, lookup_session_tree};
use crate::info_class as ic;
use crate::ntstatus;
use crate::quota;
use crate::security;
use crate::server::{ServerState, ShareBindings};

const FILE_DEVICE_DISK: u32 = 0x0000_0007;
const FILE_REMOTE_DEVICE: u32 = 0x0000_0010;

// FS attribute flags (MS-FSCC §2.5.1)
const FILE_CASE_SENSITIVE_SEARCH: u32 = 0x0000_0001;
const FILE_CASE_PRESERVED_NAMES: u32 = 0x0000_0002;
const FILE_UNICODE_ON_DISK: u32 = 0x0000_0004;

// Access mask bits (MS-SMB2 2.2.13.1.1)
const FILE_READ_EA: u32 = 0x0000_0008;
const FILE_READ_ATTRIBUTES: u32 = 0x0000_0080;

/// How a reply longer than OutputBufferLength is cut down.
#[derive(Clone, Copy)]
enum Overflow {
    /// Fixed size: the minimum length is the whole reply.
    Never,
    /// The trailing name is cut to fit, with STATUS_BUFFER_OVERFLOW.
    Truncate,
    /// Only whole entries are returned, with STATUS_BUFFER_OVERFLOW.
    WholeEntries,
    /// Already cut to fit, answered with this status (Aquifer patch: a
    /// FileFullEaInformation query that has entries left to return).
    Fitted(u32),
}

pub async fn handle(
    _server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    hdr: &Smb2Header,
    body: &[u8],
) -> HandlerResponse {
    let req = match QueryInfoRequest::parse(body) {
        Ok(r) => r,
        Err(_) => return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER),
    };
    let info_type = match req.info_type_enum() {
        Some(t) => t,
        None => return HandlerResponse::err(ntstatus::STATUS_INVALID_INFO_CLASS),
    };

    let tree_arc = match lookup_session_tree(conn, hdr).await {
        Ok(t) => t,
        Err(s) => return HandlerResponse::err(s),
    };
    let open_arc = match lookup_open(&tree_arc, req.file_id).await {
        Some(o) => o,
        None => return HandlerResponse::err(ntstatus::STATUS_FILE_CLOSED),
    };
    // NEGOTIATE advertises MaxTransactSize equal to MaxReadSize.
    if req.output_buffer_length > *conn.max_read_size.read().await {
        return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
    }
    let smb311 = *conn.dialect.read().await == Some(Dialect::Smb311);
    let cap = req.output_buffer_length as usize;

    let open = open_arc.read().await;
    let result = match info_type {
        InfoType::File => match query_file(&open, &req, cap, smb311).await {
            // MS-FSA 2.1.5.12.12: no extended attribute fits; the size of
            // the first one is what the client needs.
            Err(Refusal::TooSmall(needed)) => return buffer_too_small(needed),
            Err(Refusal::Status(status)) => Err(status),
            Ok(reply) => Ok(reply),
        },
        InfoType::FileSystem => {
            let share = Arc::clone(&tree_arc.read().await.share);
            query_filesystem(&open, &share, req.file_information_class, cap).await
        }
        InfoType::Security => match query_security(&open, req.additional_information).await {
            // MS-SMB2 3.3.5.20.3: the size needed, in a 4-byte ErrorData.
            Ok(sd) if sd.len() > cap => return buffer_too_small(sd.len()),
            Ok(sd) => Ok((sd, Overflow::Never)),
            Err(status) => Err(status),
        },
        // Aquifer patch: quota queries on the NT quota fake file are
        // answered (no entries); no other open has quotas (MS-SMB2
        // 3.3.5.20.4: a store without quotas answers STATUS_NOT_SUPPORTED).
        InfoType::Quota if open.quota_fake_file => Err(quota::query(&req.input_buffer)),
        InfoType::Quota => Err(ntstatus::STATUS_NOT_SUPPORTED),
    };
    drop(open);
    let (mut buf, overflow) = match result {
        Ok(reply) => reply,
        Err(ntstatus::STATUS_INFO_LENGTH_MISMATCH) => return info_length_mismatch(smb311),
        Err(status) => return HandlerResponse::err(status),
    };

    let mut status = ntstatus::STATUS_SUCCESS;
    if let Overflow::Fitted(fitted) = overflow {
        debug_assert!(buf.len() <= cap, "a fitted reply fits");
        status = fitted;
    } else if buf.len() > cap {
        match overflow {
            Overflow::Never => return info_length_mismatch(smb311),
            Overflow::Truncate => buf.truncate(cap),
            Overflow::WholeEntries => buf.clear(),
            Overflow::Fitted(_) => unreachable!("handled above"),
        }
        status = ntstatus::STATUS_BUFFER_OVERFLOW;
    }

    let resp = QueryInfoResponse {
        structure_size: 9,
        output_buffer_offset: 64 + 8,
        output_buffer_length: buf.len() as u32,
        buffer: buf,
    };
    let mut out = Vec::new();
    resp.write_to(&mut out)
        .expect("QUERY_INFO response encodes");
    let mut response = HandlerResponse::ok(out);
    response.status = status;
    response
}

/// STATUS_INFO_LENGTH_MISMATCH with the error data of MS-SMB2 3.3.5.20.1:
/// on SMB 3.1.1 one empty error context, otherwise none.
pub(super) fn info_length_mismatch(smb311: bool) -> HandlerResponse {
    let mut response = HandlerResponse::err(ntstatus::STATUS_INFO_LENGTH_MISMATCH);
    if smb311 {
        // StructureSize, ErrorContextCount, Reserved, ByteCount, then an
        // ERROR Context with ErrorDataLength 0 and ErrorId 0.
        let mut body = Vec::with_capacity(16);
        body.extend_from_slice(&9u16.to_le_bytes());
        body.push(1);
        body.push(0);
        body.extend_from_slice(&8u32.to_le_bytes());
        body.extend_from_slice(&[0; 8]);
        response.body = body;
    }
    response
}

/// STATUS_BUFFER_TOO_SMALL with the `needed` length as ErrorData, as
/// Windows and Samba answer a security query with too small a buffer
/// (MS-SMB2 2.2.2: ByteCount 4, no error context).
fn buffer_too_small(needed: usize) -> HandlerResponse {
    let mut response = HandlerResponse::err(ntstatus::STATUS_BUFFER_TOO_SMALL);
    let mut body = Vec::with_capacity(12);
    body.extend_from_slice(&9u16.to_le_bytes());
    body.push(0);
    body.push(0);
    body.extend_from_slice(&4u32.to_le_bytes());
    body.extend_from_slice(&(needed as u32).to_le_bytes());
    response.body = body;
    response
}

/// SMB2_0_INFO_SECURITY (MS-SMB2 3.3.5.20.3, MS-FSA 2.1.5.13; Aquifer
/// patch): the self-relative security descriptor of the open's file, with
/// the parts AdditionalInformation asks for, built from its POSIX owner,
/// group and mode.
async fn query_security(open: &Open, additional_information: u32) -> Result<Vec<u8>, u32> {
    let wanted = additional_information
        & (security::OWNER_SECURITY_INFORMATION
            | security::GROUP_SECURITY_INFORMATION
            | security::DACL_SECURITY_INFORMATION
            | security::SACL_SECURITY_INFORMATION);
    let plain = security::OWNER_SECURITY_INFORMATION
        | security::GROUP_SECURITY_INFORMATION
        | security::DACL_SECURITY_INFORMATION;
    if wanted & plain != 0 && open.granted_access & READ_CONTROL == 0 {
        return Err(ntstatus::STATUS_ACCESS_DENIED);
    }
    // No open is granted ACCESS_SYSTEM_SECURITY, so the SACL is refused as
    // Windows refuses it without the privilege.
    if wanted & security::SACL_SECURITY_INFORMATION != 0
        && open.granted_access & security::ACCESS_SYSTEM_SECURITY == 0
    {
        return Err(ntstatus::STATUS_ACCESS_DENIED);
    }
    let handle = open.handle.as_ref().ok_or(ntstatus::STATUS_FILE_CLOSED)?;
    let unix = match handle.unix_security().await {
        Ok(unix) => unix,
        // MS-FSA 2.1.5.13: the store keeps no security descriptors.
        Err(SmbError::NotSupported) => return Err(ntstatus::STATUS_INVALID_DEVICE_REQUEST),
        Err(e) => return Err(e.to_nt_status()),
    };
    Ok(security::describe(&unix, wanted).encode())
}

/// A reply and how to cut it down when it is longer than OutputBufferLength.
type Reply = Result<(Vec<u8>, Overflow), u32>;

/// Why a file query failed.
enum Refusal {
    Status(u32),
    /// STATUS_BUFFER_TOO_SMALL, with the length needed.
    TooSmall(usize),
}

impl From<u32> for Refusal {
    fn from(status: u32) -> Self {
        Refusal::Status(status)
    }
}

/// SMB2_0_INFO_FILE (MS-SMB2 3.3.5.20.1) for an OutputBufferLength of `cap`.
async fn query_file(
    open: &Open,
    req: &QueryInfoRequest,
    cap: usize,
    smb311: bool,
) -> Result<(Vec<u8>, Overflow), Refusal> {
    let class = req.file_information_class;
    let (min_len, overflow, access) = match class {
        ic::FILE_BASIC_INFORMATION => (40, Overflow::Never, FILE_READ_ATTRIBUTES),
        ic::FILE_STANDARD_INFORMATION => (24, Overflow::Never, 0),
        ic::FILE_INTERNAL_INFORMATION => (8, Overflow::Never, 0),
        ic::FILE_EA_INFORMATION => (4, Overflow::Never, 0),
        ic::FILE_ACCESS_INFORMATION => (4, Overflow::Never, 0),
        ic::FILE_POSITION_INFORMATION => (8, Overflow::Never, 0),
        ic::FILE_MODE_INFORMATION => (4, Overflow::Never, 0),
        ic::FILE_ALIGNMENT_INFORMATION => (4, Overflow::Never, 0),
        // BlockAlign(FieldOffset(NameInformation.FileName) + 2, 8).
        ic::FILE_ALL_INFORMATION => (104, Overflow::Truncate, FILE_READ_ATTRIBUTES),
        ic::FILE_NETWORK_OPEN_INFORMATION => (56, Overflow::Never, FILE_READ_ATTRIBUTES),
        // Aquifer patch: sizeof(FILE_STREAM_INFORMATION), 32 with its
        // padding, as Windows and Samba count it (upstream 24).
        ic::FILE_STREAM_INFORMATION => (32, Overflow::WholeEntries, 0),
        ic::FILE_FULL_EA_INFORMATION => (0, Overflow::Never, FILE_READ_EA),
        // Aquifer patch: the short name, cut to fit with
        // STATUS_BUFFER_OVERFLOW (MS-FSCC 2.4.5).
        ic::FILE_ALTERNATE_NAME_INFORMATION => (8, Overflow::Truncate, 0),
        // Aquifer patch: FileNormalizedNameInformation (MS-FSCC 2.4.30),
        // on SMB 3.1.1 only (MS-SMB2 3.3.5.20.1).
        ic::FILE_NORMALIZED_NAME_INFORMATION if smb311 => (8, Overflow::Truncate, 0),
        // Aquifer patch: two classes MS-SMB2 2.2.37 lists that upstream
        // answered STATUS_NOT_SUPPORTED.
        ic::FILE_COMPRESSION_INFORMATION => (16, Overflow::Never, 0),
        ic::FILE_ATTRIBUTE_TAG_INFORMATION => (8, Overflow::Never, FILE_READ_ATTRIBUTES),
        // MS-FSA 2.1.5.12.19: not available to remote clients.
        ic::FILE_NAME_INFORMATION => return Err(ntstatus::STATUS_NOT_SUPPORTED.into()),
        c if is_file_class(c) => return Err(ntstatus::STATUS_NOT_SUPPORTED.into()),
        _ => return Err(ntstatus::STATUS_INVALID_INFO_CLASS.into()),
    };
    if open.granted_access & access != access {
        return Err(ntstatus::STATUS_ACCESS_DENIED.into());
    }
    if cap < min_len {
        return Err(ntstatus::STATUS_INFO_LENGTH_MISMATCH.into());
    }
    let handle = open.handle.as_ref().ok_or(ntstatus::STATUS_FILE_CLOSED)?;
    if class == ic::FILE_FULL_EA_INFORMATION {
        return query_full_ea(open, handle.as_ref(), req, cap).await;
    }
    let info = handle.stat().await.map_err(|e| e.to_nt_status())?;
    // The open's name now: its last component, and its path from the
    // share's root (empty for the root).
    let path = open.path().unwrap_or_default();
    let ea_bytes = match class {
        ic::FILE_EA_INFORMATION | ic::FILE_ALL_INFORMATION => {
            handle.ea_size().await.map_err(|e| e.to_nt_status())?
        }
        _ => 0,
    };
    let buf = match class {
        ic::FILE_BASIC_INFORMATION => ic::encode_file_basic_information(&info),
        ic::FILE_STANDARD_INFORMATION | ic::FILE_ALL_INFORMATION => {
            let links = handle.link_count().await.map_err(|e| e.to_nt_status())?;
            if class == ic::FILE_STANDARD_INFORMATION {
                ic::encode_file_standard_information(&info, links, open.delete_pending())
            } else {
                let name = open
                    .path()
                    .map(|path| format!("\\{}", path.display_backslash()))
                    .unwrap_or_default();
                ic::encode_file_all_information(
                    &info,
                    open.granted_access,
                    links,
                    open.delete_pending(),
                    position(open),
                    ea_bytes,
                    &name,
                )
            }
        }
        ic::FILE_INTERNAL_INFORMATION => ic::encode_file_internal_information(info.file_index),
        ic::FILE_EA_INFORMATION => ic::encode_file_ea_information(ea_bytes),
        ic::FILE_ACCESS_INFORMATION => ic::encode_file_access_information(open.granted_access),
        ic::FILE_POSITION_INFORMATION => ic::encode_file_position_information(position(open)),
        ic::FILE_MODE_INFORMATION => ic::encode_file_mode_information(0),
        ic::FILE_ALIGNMENT_INFORMATION => ic::encode_file_alignment_information(),
        ic::FILE_NETWORK_OPEN_INFORMATION => ic::encode_file_network_open_information(&info),
        ic::FILE_COMPRESSION_INFORMATION => ic::encode_file_compression_information(&info),
        ic::FILE_ATTRIBUTE_TAG_INFORMATION => ic::encode_file_attribute_tag_information(&info),
        ic::FILE_STREAM_INFORMATION => ic::encode_file_stream_information(&info),
        // MS-FSA 2.1.5.12.4 (Aquifer patch; upstream answered
        // STATUS_OBJECT_NAME_NOT_FOUND for every file): the short name, or
        // the name itself when it is an 8.3 name, which NTFS keeps as both.
        // The root has none.
        ic::FILE_ALTERNATE_NAME_INFORMATION => {
            let name = path
                .file_name()
                .ok_or(ntstatus::STATUS_OBJECT_NAME_NOT_FOUND)?;
            let short = short_name::short_name(name);
            ic::encode_file_name_information(short.as_deref().unwrap_or(name))
        }
        // The path from the share's root as stored, without a leading
        // backslash; empty for the root (MS-FSA 2.1.5.12.21).
        ic::FILE_NORMALIZED_NAME_INFORMATION => {
            ic::encode_file_name_information(&path.display_backslash())
        }
        _ => unreachable!("class checked above"),
    };
    Ok((buf, overflow))
}

/// SMB2_0_INFO_FILESYSTEM (MS-SMB2 3.3.5.20.2) for an OutputBufferLength
/// of `cap`.
async fn query_filesystem(open: &Open, share: &ShareBindings, class: u8, cap: usize) -> Reply {
    let (min_len, overflow) = match class {
        // BlockAlign(FieldOffset(VolumeLabel), 8).
        ic::FS_VOLUME_INFORMATION => (24, Overflow::Truncate),
        ic::FS_SIZE_INFORMATION => (24, Overflow::Never),
        ic::FS_DEVICE_INFORMATION => (8, Overflow::Never),
        // BlockAlign(FieldOffset(FileSystemName), 4).
        ic::FS_ATTRIBUTE_INFORMATION => (12, Overflow::Truncate),
        ic::FS_FULL_SIZE_INFORMATION => (32, Overflow::Never),
        ic::FS_SECTOR_SIZE_INFORMATION => (28, Overflow::Never),
        // Aquifer patch: FileFsControlInformation (no quotas) and
        // FileFsObjectIdInformation, which Windows and Samba answer.
        ic::FS_CONTROL_INFORMATION => (48, Overflow::Never),
        ic::FS_OBJECT_ID_INFORMATION => (64, Overflow::Never),
        // FileFsLabelInformation, FileFsDriverPathInformation and
        // FileFsVolumeFlagsInformation.
        2 | 9 | 10 => return Err(ntstatus::STATUS_NOT_SUPPORTED),
        _ => return Err(ntstatus::STATUS_INVALID_INFO_CLASS),
    };
    if cap < min_len {
        return Err(ntstatus::STATUS_INFO_LENGTH_MISMATCH);
    }
    if class == ic::FS_DEVICE_INFORMATION {
        let buf = ic::encode_fs_device_information(FILE_DEVICE_DISK, FILE_REMOTE_DEVICE);
        return Ok((buf, overflow));
    }
    if class == ic::FS_CONTROL_INFORMATION {
        return Ok((ic::encode_fs_control_information(), overflow));
    }
    let volume = share
        .backend
        .volume_info()
        .await
        .map_err(|e| e.to_nt_status())?;
    let buf = match class {
        ic::FS_VOLUME_INFORMATION => {
            let handle = open.handle.as_ref().ok_or(ntstatus::STATUS_FILE_CLOSED)?;
            let creation_time = handle.stat().await.map_or(0, |i| i.creation_time);
            let label = volume.label.as_deref().unwrap_or(&share.name);
            ic::encode_fs_volume_information(creation_time, volume.serial_number, label)
        }
        ic::FS_SIZE_INFORMATION => ic::encode_fs_size_information(
            volume.total_allocation_units,
            volume.caller_available_allocation_units,
            volume.sectors_per_allocation_unit,
            volume.bytes_per_sector,
        ),
        ic::FS_ATTRIBUTE_INFORMATION => {
            let case_sensitive = if share.backend.capabilities().case_sensitive {
                FILE_CASE_SENSITIVE_SEARCH
            } else {
                0
            };
            ic::encode_fs_attribute_information(
                case_sensitive | FILE_CASE_PRESERVED_NAMES | FILE_UNICODE_ON_DISK,
                volume.max_name_length,
                "NTFS",
            )
        }
        ic::FS_FULL_SIZE_INFORMATION => ic::encode_fs_full_size_information(
            volume.total_allocation_units,
            volume.caller_available_allocation_units,
            volume.actual_available_allocation_units,
            volume.sectors_per_allocation_unit,
            volume.bytes_per_sector,
        ),
        ic::FS_SECTOR_SIZE_INFORMATION => {
            ic::encode_fs_sector_size_information(volume.bytes_per_sector)
        }
        ic::FS_OBJECT_ID_INFORMATION => {
            let label = volume.label.as_deref().unwrap_or(&share.name);
            ic::encode_fs_object_id_information(volume_object_id(volume.serial_number, label))
        }
        _ => unreachable!("class checked above"),
    };
    Ok((buf, overflow))
}

/// The volume's object id for FileFsObjectIdInformation: MD5 of its serial
/// number and label, so it stays the same for a share across restarts and
/// differs between shares (Samba derives it from the share name too).
pub(super) fn volume_object_id(serial_number: u32, label: &str) -> [u8; 16] {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    h.update(serial_number.to_le_bytes());
    h.update(label.as_bytes());
    h.finalize().into()
}

/// FileFullEaInformation (MS-FSA 2.1.5.12.12, MS-SMB2 3.3.5.20.1; Aquifer
/// patch, upstream answered STATUS_NO_EAS_ON_FILE). With a
/// FILE_GET_EA_INFORMATION list in the input buffer, the attributes it
/// names, in its order, one the file lacks with an empty value (as NTFS
/// answers). Otherwise the file's attributes from Open.NextEaEntry, from the
/// first with SL_RESTART_SCAN, or from the 1-based index in
/// AdditionalInformation with SL_INDEX_SPECIFIED; as many whole entries as
/// fit (one with SL_RETURN_SINGLE_ENTRY), STATUS_BUFFER_OVERFLOW when some
/// are left, STATUS_BUFFER_TOO_SMALL when none fits, STATUS_NO_EAS_ON_FILE
/// for a file without attributes and STATUS_NO_MORE_EAS past the last.
async fn query_full_ea(
    open: &Open,
    handle: &dyn Handle,
    req: &QueryInfoRequest,
    cap: usize,
) -> Result<(Vec<u8>, Overflow), Refusal> {
    let eas = handle
        .extended_attributes()
        .await
        .map_err(|e| e.to_nt_status())?;
    let single = req.flags & QueryInfoRequest::FLAG_RETURN_SINGLE_ENTRY != 0;
    let (listed, start) = if !req.input_buffer.is_empty() {
        let names = ea::parse_get_ea_list(&req.input_buffer)?;
        let listed: Vec<ExtendedAttribute> = names
            .into_iter()
            .map(|name| {
                eas.iter()
                    .find(|ea| ea.name.eq_ignore_ascii_case(&name))
                    .cloned()
                    .unwrap_or_else(|| ExtendedAttribute::new(name, Vec::new()))
            })
            .collect();
        (listed, 0)
    } else {
        if eas.is_empty() {
            return Err(ntstatus::STATUS_NO_EAS_ON_FILE.into());
        }
        let start = if req.flags & QueryInfoRequest::FLAG_INDEX_SPECIFIED != 0 {
            let index = req.additional_information as usize;
            if index == 0 || index > eas.len() {
                return Err(ntstatus::STATUS_NONEXISTENT_EA_ENTRY.into());
            }
            index - 1
        } else if req.flags & QueryInfoRequest::FLAG_RESTART_SCAN != 0 {
            0
        } else {
            open.next_ea_entry.load(Ordering::Relaxed)
        };
        if start >= eas.len() {
            return Err(ntstatus::STATUS_NO_MORE_EAS.into());
        }
        (eas, start)
    };
    let rest = &listed[start..];
    let (buf, count) = ea::encode_full_ea_list(rest, cap, single);
    if count == 0 {
        let needed = ea::encode_full_ea_list(&rest[..1], usize::MAX, true).0.len();
        return Err(Refusal::TooSmall(needed));
    }
    if req.input_buffer.is_empty() {
        open.next_ea_entry.store(start + count, Ordering::Relaxed);
    }
    let status = if count < rest.len() && !single {
        ntstatus::STATUS_BUFFER_OVERFLOW
    } else {
        ntstatus::STATUS_SUCCESS
    };
    Ok((buf, Overflow::Fitted(status)))
}

/// The open's CurrentByteOffset (MS-FSA 2.1.1.6).
fn position(open: &Open) -> u64 {
    open.file.as_ref().map_or(0, |f| f.position())
}

/// True if MS-FSCC 2.4 documents `class` as a file information class.
fn is_file_class(class: u8) -> bool {
    matches!(class, 1..=29 | 31..=40 | 44..=46 | 48 | 50 | 54 | 59 | 60 | 64 | 65 | 78..=81)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_error_on_smb311_carries_one_empty_error_context() {
        let response = info_length_mismatch(true);
        assert_eq!(response.status, ntstatus::STATUS_INFO_LENGTH_MISMATCH);
        assert_eq!(
            response.body,
            [9, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let response = info_length_mismatch(false);
        assert_eq!(response.body, [9, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
}
