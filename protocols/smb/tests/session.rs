//! Session binding (multichannel) and re-authentication end to end: Samba's `smbtorture`
//! (apt `samba-testsuite`) runs tests of its `smb2.session` suite against the SMB service over
//! an engine in a temporary directory.
//!
//! - `bind1`, `bind2`: a second and a third connection bound to sessions of other
//!   connections (SMB2_SESSION_FLAG_BINDING, MS-SMB2 3.3.5.5.2), requests of a session on each
//!   of its channels, a connection that closes taking only its channel, the last one its
//!   session and opens.
//! - `bind_invalid_auth`: a binding with a wrong password refused and changing nothing, a
//!   failed re-authentication on a bound channel ending the session on every channel.
//! - `bind_negative_*`: bindings refused with the status Windows and Samba give for each
//!   mismatch of dialect, signing algorithm or cipher with the session's connection, and after
//!   a refusal the session still serves its first connection; two of them bind successfully
//!   with different signing algorithms and then check that the bound connection refuses a
//!   non-binding SESSION_SETUP signed with the session's key.
//! - `reauth1`, `reauth6`: re-authentication keeps the session and its opens; a failed one ends
//!   the session.
//! - `ntlmssp_bug14932`: a malformed NTLMv2 response is STATUS_INVALID_PARAMETER.
//!
//! The list is the tests of the suite Aquifer passes (docs/smb-conformance.md) but
//! `bind_negative_smb3signCtoHd` and `bind_negative_smb3signHtoCd`, which Samba fails too (a
//! binding from another ClientGuid is refused); a regression in any of them fails this test.

mod common;

const TESTS: &[&str] = &[
    "reconnect1",
    "reconnect2",
    "reauth1",
    "reauth6",
    "bind1",
    "bind2",
    "bind_invalid_auth",
    "bind_negative_smb202",
    "bind_negative_smb210s",
    "bind_negative_smb210d",
    "bind_negative_smb2to3s",
    "bind_negative_smb2to3d",
    "bind_negative_smb3to2s",
    "bind_negative_smb3to2d",
    "bind_negative_smb3to3s",
    "bind_negative_smb3to3d",
    "bind_negative_smb3encGtoCs",
    "bind_negative_smb3encGtoCd",
    "bind_negative_smb3signCtoHs",
    "bind_negative_smb3signCtoGs",
    "bind_negative_smb3signCtoGd",
    "bind_negative_smb3signHtoCs",
    "bind_negative_smb3signHtoGs",
    "bind_negative_smb3signHtoGd",
    "bind_negative_smb3signGtoCs",
    "bind_negative_smb3signGtoCd",
    "bind_negative_smb3signGtoHs",
    "bind_negative_smb3signGtoHd",
    "bind_negative_smb3sneGtoCs",
    "bind_negative_smb3sneGtoCd",
    "bind_negative_smb3sneGtoHs",
    "bind_negative_smb3sneGtoHd",
    "bind_negative_smb3sneCtoGs",
    "bind_negative_smb3sneCtoGd",
    "bind_negative_smb3sneHtoGs",
    "bind_negative_smb3sneHtoGd",
    "bind_negative_smb3signC30toGs",
    "bind_negative_smb3signC30toGd",
    "bind_negative_smb3signH2XtoGs",
    "bind_negative_smb3signH2XtoGd",
    "bind_negative_smb3signGtoC30s",
    "bind_negative_smb3signGtoC30d",
    "bind_negative_smb3signGtoH2Xs",
    "bind_negative_smb3signGtoH2Xd",
    "two_logoff",
    "signing-hmac-sha-256",
    "signing-aes-128-cmac",
    "signing-aes-128-gmac",
    "encryption-aes-128-ccm",
    "encryption-aes-128-gcm",
    "encryption-aes-256-ccm",
    "encryption-aes-256-gcm",
    "ntlmssp_bug14932",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_session_tests_pass() {
    common::assert_smbtorture_passes("smb2.session", TESTS).await;
}
