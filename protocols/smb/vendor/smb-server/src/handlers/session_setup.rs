//! SESSION_SETUP handler: drives the SPNEGO + NTLMv2 state machine.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::proto::auth::ntlm::{
    AuthOutcome, Direction, Identity, NTLMSSP_SIGNATURE, NtlmAuthenticate, NtlmMac, NtlmServer,
    NtlmTargetInfo, UserCreds,
};
use crate::proto::auth::spnego::{
    NegState, NegTokenInit, OID_NTLMSSP, decode_init_token, decode_resp_token, encode_resp_token,
};
use crate::proto::crypto::{SessionCipher, SigningAlgo, signing_key_30};
use crate::proto::error::ProtoError;
use crate::proto::header::SMB2_FLAGS_SIGNED;
use crate::proto::header::Smb2Header;
use crate::proto::messages::{Dialect, SessionSetupRequest, SessionSetupResponse};
use tracing::{debug, info, warn};

use crate::conn::state::{Connection, MAX_PENDING_AUTHS, PendingAuth, Session, SessionOrigin};
use crate::dispatch::HandlerResponse;
use crate::ntstatus;
use crate::server::ServerState;
use crate::utils::{fill_random, now_filetime};

/// A SESSION_SETUP security token, by form.
enum Token {
    /// Raw NTLMSSP. RFC 4178 section 4.2.1 lets the client skip SPNEGO once
    /// the mechanism is settled.
    Raw { msg_type: u32, ntlm: Vec<u8> },
    /// GSS-API NegTokenInit (starts with 0x60).
    Init(NegTokenInit),
    /// SPNEGO NegTokenResp: the inner token and the client's mechListMIC.
    Resp {
        ntlm: Vec<u8>,
        mech_list_mic: Option<Vec<u8>>,
    },
}

impl Token {
    fn decode(blob: &[u8]) -> Result<Self, u32> {
        if blob.starts_with(NTLMSSP_SIGNATURE) {
            let msg_type = blob
                .get(8..12)
                .map_or(0, |t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]));
            return Ok(Token::Raw {
                msg_type,
                ntlm: blob.to_vec(),
            });
        }
        if blob[0] == 0x60 {
            return match decode_init_token(blob) {
                Ok(init) => Ok(Token::Init(init)),
                Err(e) => {
                    warn!(error = %e, "SPNEGO init decode failed");
                    Err(ntstatus::STATUS_LOGON_FAILURE)
                }
            };
        }
        match decode_resp_token(blob) {
            Ok(resp) => Ok(Token::Resp {
                ntlm: resp.response_token.unwrap_or_default(),
                mech_list_mic: resp.mech_list_mic,
            }),
            Err(e) => {
                warn!(error = %e, "SPNEGO resp decode failed");
                Err(ntstatus::STATUS_LOGON_FAILURE)
            }
        }
    }
}

/// The token that opens an exchange.
enum Opening {
    /// Raw NTLM NEGOTIATE_MESSAGE.
    Raw(Vec<u8>),
    Spnego(NegTokenInit),
}

pub async fn handle(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    hdr: &Smb2Header,
    body: &[u8],
) -> HandlerResponse {
    let req = match SessionSetupRequest::parse(body) {
        Ok(r) => r,
        Err(_) => return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER),
    };

    let blob = &req.security_buffer;
    if blob.is_empty() {
        return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
    }
    // MS-SMB2 3.3.5.5: while every session is encrypted and unencrypted
    // access is rejected, a client that cannot encrypt gets no session.
    let settings = &server.auth.settings;
    if settings.encrypt_data
        && settings.reject_unencrypted_access
        && conn.cipher.read().await.is_none()
    {
        info!("session setup refused: the server encrypts and the client cannot");
        return HandlerResponse::err(ntstatus::STATUS_ACCESS_DENIED);
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        let mut first8 = String::with_capacity(16);
        for b in blob.iter().take(8) {
            use std::fmt::Write as _;
            write!(&mut first8, "{b:02x}").expect("writing to String cannot fail");
        }
        tracing::debug!(
            first8 = %first8,
            len = blob.len(),
            sid = hdr.session_id,
            "session setup blob"
        );
    }

    let sid = hdr.session_id;
    let signed = hdr.flags & SMB2_FLAGS_SIGNED != 0;
    // Aquifer patch: binding this connection to a session established on
    // another one (multichannel, MS-SMB2 3.3.5.5.2).
    if req.flags & SessionSetupRequest::FLAG_BINDING != 0 {
        if sid == 0 {
            return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
        }
        return bind(server, conn, hdr, &req).await;
    }

    let token = match Token::decode(blob) {
        Ok(t) => t,
        Err(status) => return HandlerResponse::err(status),
    };

    let opening = match token {
        Token::Raw { msg_type: 1, ntlm } => Opening::Raw(ntlm),
        Token::Init(init) => Opening::Spnego(init),
        Token::Raw { ntlm, .. } => {
            return continue_or_reject(server, conn, &req, sid, ntlm, None, None).await;
        }
        Token::Resp {
            ntlm,
            mech_list_mic,
        } => {
            return continue_or_reject(server, conn, &req, sid, ntlm, mech_list_mic, None).await;
        }
    };

    if sid == 0 {
        if session_limit_reached(server, &*conn.sessions.read().await) {
            warn!("session limit reached on connection");
            return HandlerResponse::err(ntstatus::STATUS_INSUFFICIENT_RESOURCES);
        }
        let new_sid = server.auth.alloc_session_id();
        return begin_exchange(server, conn, new_sid, opening, false).await;
    }
    // A first token for a known session starts over: reauthentication of
    // an established session (MS-SMB2 3.3.5.5.2), or a restart of one in
    // progress.
    let known = conn.sessions.read().await.contains_key(&sid)
        || conn.pending_auths.write().await.remove(&sid).is_some();
    if !known {
        return HandlerResponse::err(ntstatus::STATUS_USER_SESSION_DELETED);
    }
    begin_exchange(server, conn, sid, opening, signed).await
}

/// A SESSION_SETUP with SMB2_SESSION_FLAG_BINDING (MS-SMB2 3.3.5.5.2): the
/// session must exist on some connection, this connection must match the
/// one it was established on, and the request must be signed with the
/// session's key (the dispatcher checked the signature). Each round runs
/// the checks again; a refusal changes nothing. The statuses and their
/// order are those Windows and Samba answer (smbtorture's
/// `smb2.session.bind_negative_*`).
async fn bind(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    hdr: &Smb2Header,
    req: &SessionSetupRequest,
) -> HandlerResponse {
    let sid = hdr.session_id;
    let Some(session) = crate::dispatch::find_session(server, sid).await else {
        return HandlerResponse::err(ntstatus::STATUS_USER_SESSION_DELETED);
    };
    if let Err(status) = binding_refused(conn, hdr, &session).await {
        info!(
            session = sid,
            status = format_args!("{status:#010x}"),
            "session binding refused"
        );
        return HandlerResponse::err(status);
    }
    let token = match Token::decode(&req.security_buffer) {
        Ok(t) => t,
        Err(status) => return HandlerResponse::err(status),
    };
    let opening = match token {
        Token::Raw { msg_type: 1, ntlm } => Opening::Raw(ntlm),
        Token::Init(init) => Opening::Spnego(init),
        Token::Raw { ntlm, .. } => {
            return continue_or_reject(server, conn, req, sid, ntlm, None, Some(session)).await;
        }
        Token::Resp {
            ntlm,
            mech_list_mic,
        } => {
            return continue_or_reject(server, conn, req, sid, ntlm, mech_list_mic, Some(session))
                .await;
        }
    };
    // A first token starts the exchange over.
    conn.pending_auths.write().await.remove(&sid);
    begin_exchange(server, conn, sid, opening, true).await
}

/// Why this connection cannot be bound to `session`, if it cannot.
async fn binding_refused(
    conn: &Connection,
    hdr: &Smb2Header,
    session: &Arc<tokio::sync::RwLock<Session>>,
) -> Result<(), u32> {
    // Connection tables are locked before sessions.
    let in_table = conn.sessions.read().await.contains_key(&hdr.session_id);
    let sess = session.read().await;
    let Some(origin) = sess.origin else {
        return Err(ntstatus::STATUS_REQUEST_NOT_ACCEPTED);
    };
    let algo = *conn.signing_algo.read().await;
    let dialect = *conn.dialect.read().await;
    let cipher = *conn.cipher.read().await;
    let client_guid = *conn.client_guid.read().await;
    let multi_channel = conn
        .client_negotiate
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .as_ref()
        .is_some_and(|n| n.capabilities & crate::handlers::negotiate::CAP_MULTI_CHANNEL != 0);
    // AES-GMAC on either side only binds to AES-GMAC (MS-SMB2 3.3.5.5.2).
    if origin.signing_algo == SigningAlgo::AesGmac && algo != origin.signing_algo {
        return Err(ntstatus::STATUS_REQUEST_OUT_OF_SEQUENCE);
    }
    if algo == SigningAlgo::AesGmac && algo != origin.signing_algo {
        return Err(ntstatus::STATUS_NOT_SUPPORTED);
    }
    let smb3 = matches!(
        dialect,
        Some(Dialect::Smb300 | Dialect::Smb302 | Dialect::Smb311)
    );
    if !smb3 || !multi_channel {
        return Err(ntstatus::STATUS_REQUEST_NOT_ACCEPTED);
    }
    if dialect != Some(origin.dialect) || cipher != origin.cipher {
        return Err(ntstatus::STATUS_INVALID_PARAMETER);
    }
    if client_guid != origin.client_guid {
        return Err(ntstatus::STATUS_USER_SESSION_DELETED);
    }
    if hdr.flags & SMB2_FLAGS_SIGNED == 0 {
        return Err(ntstatus::STATUS_INVALID_PARAMETER);
    }
    if sess.is_anonymous() || origin.guest {
        return Err(ntstatus::STATUS_NOT_SUPPORTED);
    }
    if in_table || sess.has_channel(conn) {
        return Err(ntstatus::STATUS_REQUEST_NOT_ACCEPTED);
    }
    Ok(())
}

/// A token that continues the exchange of `sid`.
async fn continue_or_reject(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    req: &SessionSetupRequest,
    sid: u64,
    ntlm: Vec<u8>,
    client_mic: Option<Vec<u8>>,
    binding: Option<Arc<tokio::sync::RwLock<Session>>>,
) -> HandlerResponse {
    if sid == 0 {
        return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
    }
    let pending = conn.pending_auths.write().await.remove(&sid);
    let Some(pending) = pending else {
        return HandlerResponse::err(ntstatus::STATUS_USER_SESSION_DELETED);
    };
    let exchange = Exchange {
        sid,
        pending,
        binding,
    };
    continue_exchange(server, conn, req, exchange, ntlm, client_mic).await
}

/// First round: start an NTLM acceptor for `sid` and answer with the
/// CHALLENGE_MESSAGE, or with an SPNEGO counter-proposal for NTLM.
async fn begin_exchange(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    sid: u64,
    opening: Opening,
    signed: bool,
) -> HandlerResponse {
    let mut server_challenge = [0u8; 8];
    if let Err(e) = fill_random(&mut server_challenge) {
        tracing::error!(error = %e, "OS RNG failed; cannot generate NTLM challenge");
        return HandlerResponse::err(ntstatus::STATUS_INTERNAL_ERROR);
    }
    let netbios = server.config.netbios_name.clone();
    let mut acceptor = NtlmServer::new(
        server_challenge,
        NtlmTargetInfo::new(netbios.clone(), netbios.clone(), netbios, "", ""),
        now_filetime(),
    );

    let (outbound, raw) = match opening {
        Opening::Raw(ntlm) => match accept_negotiate(&mut acceptor, &ntlm) {
            Ok(challenge) => (challenge, true),
            Err(status) => return HandlerResponse::err(status),
        },
        Opening::Spnego(init) => {
            let Some(pos) = init.mech_types.iter().position(|m| m == OID_NTLMSSP) else {
                return HandlerResponse::err(ntstatus::STATUS_NOT_SUPPORTED);
            };
            acceptor.mech_list = Some(init.mech_types_der);
            acceptor.mech_list_mic_required = pos != 0;
            // An optimistic mechToken is for the client's first mechanism,
            // so it is used only when that mechanism is NTLM. Otherwise the
            // reply selects NTLM and waits for its NEGOTIATE_MESSAGE.
            match init.mech_token.filter(|_| pos == 0) {
                Some(ntlm) => match accept_negotiate(&mut acceptor, &ntlm) {
                    Ok(challenge) => (
                        encode_resp_token(
                            NegState::AcceptIncomplete,
                            Some(OID_NTLMSSP),
                            Some(&challenge),
                            None,
                        ),
                        false,
                    ),
                    Err(status) => return HandlerResponse::err(status),
                },
                None => {
                    let state = if pos == 0 {
                        NegState::AcceptIncomplete
                    } else {
                        NegState::RequestMic
                    };
                    (
                        encode_resp_token(state, Some(OID_NTLMSSP), None, None),
                        false,
                    )
                }
            }
        }
    };

    {
        let mut pa = conn.pending_auths.write().await;
        if pa.len() >= MAX_PENDING_AUTHS {
            warn!(
                pending = pa.len(),
                "too many pending NTLM exchanges on connection"
            );
            return HandlerResponse::err(ntstatus::STATUS_INSUFFICIENT_RESOURCES);
        }
        pa.insert(sid, Arc::new(std::sync::Mutex::new((acceptor, raw))));
    }
    more_processing(sid, &outbound, signed)
}

/// Feeds the client's NEGOTIATE_MESSAGE to `acceptor` and returns the
/// CHALLENGE_MESSAGE.
fn accept_negotiate(acceptor: &mut NtlmServer, ntlm: &[u8]) -> Result<Vec<u8>, u32> {
    if let Err(e) = acceptor.step1_negotiate(ntlm) {
        warn!(error = %e, "NTLM step1 failed");
        return Err(ntstatus::STATUS_LOGON_FAILURE);
    }
    Ok(acceptor.challenge())
}

/// An interim SESSION_SETUP response. One to a signed request (a
/// reauthentication or a binding, Aquifer patch) is signed with the key the
/// request was signed with, as clients check; a new session has no key yet.
fn more_processing(sid: u64, outbound: &[u8], signed: bool) -> HandlerResponse {
    let body_out =
        build_session_setup_response(ntstatus::STATUS_MORE_PROCESSING_REQUIRED, outbound, 0);
    HandlerResponse {
        body: body_out,
        status: ntstatus::STATUS_MORE_PROCESSING_REQUIRED,
        override_tree_id: None,
        override_session_id: Some(sid),
        skip_signing: !signed,
        take_preauth_snapshot_for_session: None,
        after_send: Vec::new(),
        header_room: false,
        tail: None,
    }
}

/// An exchange waiting for its next round: its SessionId, its NTLM
/// acceptor, and for a binding the session this connection binds to.
struct Exchange {
    sid: u64,
    pending: PendingAuth,
    binding: Option<Arc<tokio::sync::RwLock<Session>>>,
}

/// Later rounds of an exchange.
async fn continue_exchange(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    req: &SessionSetupRequest,
    exchange: Exchange,
    ntlm: Vec<u8>,
    client_mic: Option<Vec<u8>>,
) -> HandlerResponse {
    let Exchange {
        sid,
        pending,
        binding,
    } = exchange;
    // After a counter-proposal the client's next token is the NTLM
    // NEGOTIATE_MESSAGE.
    let challenge = {
        let mut pair = pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if pair.0.has_negotiate() {
            None
        } else {
            match accept_negotiate(&mut pair.0, &ntlm) {
                Ok(challenge) => Some(challenge),
                Err(status) => return HandlerResponse::err(status),
            }
        }
    };
    if let Some(challenge) = challenge {
        let outbound = encode_resp_token(NegState::AcceptIncomplete, None, Some(&challenge), None);
        conn.pending_auths.write().await.insert(sid, pending);
        return more_processing(sid, &outbound, binding.is_some());
    }

    // A session that already exists is being reauthenticated; a binding
    // authenticates for a session of another connection.
    let existing = if binding.is_some() {
        None
    } else {
        conn.sessions.read().await.get(&sid).cloned()
    };

    // The failed-logon throttle counts by the user name the client sent and
    // by the client's address. The guest password is empty and known to
    // everyone, so guest logons count by address only: a lockout of the
    // name would shut every client out of guest access.
    let claimed_user = NtlmAuthenticate::parse(&ntlm)
        .map(|a| a.user)
        .unwrap_or_default();
    let throttled_user = if is_guest(&*server.users.table.read().await, &claimed_user) {
        ""
    } else {
        claimed_user.as_str()
    };
    let peer = conn.peer_addr.map(|a| a.ip());
    if server.auth.is_locked_out(throttled_user, peer) {
        info!("logon refused: too many failed logons for this user name or address");
        return logon_failed(
            server,
            conn,
            sid,
            existing.is_some(),
            None,
            ntstatus::STATUS_ACCOUNT_LOCKED_OUT,
        )
        .await;
    }

    // A guest logon is checked against the empty password, and only while
    // a share is public.
    let public = eq_ignore_case(&claimed_user, GUEST) && server.anonymous_allowed().await;
    let users = server.users.table.read().await;
    let result = {
        let pair = pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (acceptor, raw_form) = (&pair.0, pair.1);
        let lookup = |u: &str, _d: &str| match configured_user(&users, u) {
            Some((_, creds)) => Some(creds.clone()),
            None => (public && is_guest(&users, u)).then(|| UserCreds::from_password("")),
        };
        acceptor
            .authenticate(&ntlm, lookup)
            .map_err(|e| {
                info!(error = %e, "NTLM authenticate failed");
                // A message that does not parse is refused as Windows and
                // Samba refuse it (Aquifer patch).
                match e {
                    ProtoError::Malformed(_) => ntstatus::STATUS_INVALID_PARAMETER,
                    _ => ntstatus::STATUS_LOGON_FAILURE,
                }
            })
            .and_then(|mut outcome| {
                // The session carries the configured spelling of the name,
                // which share access is granted to.
                let mut nt_hash = None;
                let mut guest = false;
                if let Identity::User { user, .. } = &mut outcome.identity {
                    match configured_user(&users, user) {
                        Some((name, creds)) => {
                            *user = name.clone();
                            nt_hash = Some(creds.nt_hash);
                        }
                        None => guest = public && is_guest(&users, user),
                    }
                }
                let mic = if raw_form {
                    None
                } else {
                    mech_list_mic(acceptor, &outcome, client_mic.as_deref())?
                };
                // A guest gets an anonymous session: the public shares and
                // no key.
                if guest {
                    outcome.identity = Identity::Anonymous;
                    outcome.session_key = [0; 16];
                }
                Ok((outcome, raw_form, mic, nt_hash, guest))
            })
    };
    drop(users);
    let (outcome, raw_form, server_mic, nt_hash, guest) = match result {
        Ok(r) => r,
        Err(status) => {
            return logon_failed(
                server,
                conn,
                sid,
                existing.is_some(),
                Some(throttled_user),
                status,
            )
            .await;
        }
    };
    if !throttled_user.is_empty() {
        server.auth.record_success(throttled_user);
    }

    // Anonymous gating.
    if matches!(outcome.identity, Identity::Anonymous) && !server.anonymous_allowed().await {
        return HandlerResponse::err(ntstatus::STATUS_LOGON_FAILURE);
    }
    // MS-SMB2 3.3.5.5.3 sets Session.SigningRequired when the request's
    // SecurityMode has SIGNING_REQUIRED, guests included, and a guest
    // session has no key to sign with. The spec names no status for this;
    // MS-SMB2 3.3.5.5 refuses a session that cannot be encrypted as the
    // server requires with STATUS_ACCESS_DENIED, and the same status is used
    // here.
    if guest && req.security_mode & SessionSetupRequest::SECURITY_SIGNING_REQUIRED != 0 {
        info!("guest logon refused: the client requires signing");
        return HandlerResponse::err(ntstatus::STATUS_ACCESS_DENIED);
    }

    let session_base_key = outcome.session_key;
    let dialect = *conn.dialect.read().await;
    let Some(dialect) = dialect else {
        return HandlerResponse::err(ntstatus::STATUS_INVALID_PARAMETER);
    };

    // MS-SMB2 3.3.5.5.3: anonymous sessions are flagged IS_NULL, guest
    // sessions IS_GUEST. Authenticated sessions on a connection with a
    // cipher get encryption keys, and are encrypted when the server
    // encrypts every session.
    let anonymous = matches!(outcome.identity, Identity::Anonymous);
    let cipher = (*conn.cipher.read().await).filter(|_| !anonymous);
    let encrypt_data = server.auth.settings.encrypt_data && cipher.is_some();
    let session_flags = if guest {
        SessionSetupResponse::FLAG_IS_GUEST
    } else if anonymous {
        SessionSetupResponse::FLAG_IS_NULL
    } else if encrypt_data {
        SessionSetupResponse::FLAG_ENCRYPT_DATA
    } else {
        0
    };
    let success_buf: Vec<u8> = if raw_form {
        Vec::new()
    } else {
        encode_resp_token(NegState::AcceptCompleted, None, None, server_mic.as_deref())
    };
    let body_out =
        build_session_setup_response(ntstatus::STATUS_SUCCESS, &success_buf, session_flags);
    let mut response = HandlerResponse {
        body: body_out,
        status: ntstatus::STATUS_SUCCESS,
        override_tree_id: None,
        override_session_id: Some(sid),
        // Anonymous and guest sessions have no key; the dispatcher signs
        // the rest.
        skip_signing: anonymous,
        take_preauth_snapshot_for_session: None,
        after_send: Vec::new(),
        header_room: false,
        tail: None,
    };

    // Reauthentication keeps the session, its key and its trees
    // (MS-SMB2 3.3.5.5.2), for the same user only.
    // Guest sessions are anonymous sessions flagged IS_GUEST; the log
    // names them as guests.
    let identity = if guest {
        "Guest".to_string()
    } else {
        format!("{:?}", outcome.identity)
    };
    if let Some(existing) = existing {
        if !same_user(&existing.read().await.identity, &outcome.identity) {
            info!(%identity, "reauthentication as another user refused");
            return HandlerResponse::err(ntstatus::STATUS_ACCESS_DENIED);
        }
        info!(%identity, "session reauthenticated");
        return response;
    }
    if let Some(session) = binding {
        return bind_channel(server, conn, sid, &session, &outcome, dialect, response).await;
    }

    let signing_key = signing_key(dialect, &session_base_key);
    let signing_required = signing_required(server, conn, req, &outcome.identity);
    let mut session = Session::new(
        outcome.identity.clone(),
        session_base_key,
        signing_key,
        signing_required,
        None,
    );
    session.encrypt_data = encrypt_data;
    session.origin = Some(SessionOrigin {
        dialect,
        signing_algo: *conn.signing_algo.read().await,
        cipher: *conn.cipher.read().await,
        client_guid: *conn.client_guid.read().await,
        guest,
    });
    // SMB 3.1.1 keys come from the preauth hash, once it is known.
    if dialect != Dialect::Smb311
        && let Some(cipher) = cipher
    {
        session.cipher = Some(Arc::new(SessionCipher::derive(
            cipher,
            &session_base_key,
            None,
        )));
    }
    let session_arc = Arc::new(tokio::sync::RwLock::new(session));
    {
        let mut sessions = conn.sessions.write().await;
        if session_limit_reached(server, &sessions) {
            warn!("session limit reached on connection");
            return HandlerResponse::err(ntstatus::STATUS_INSUFFICIENT_RESOURCES);
        }
        // ConfigHandle::remove_user drops the user before it closes the
        // user's sessions, and that sweep waits for this lock. A user that is
        // gone, or whose password changed, since it authenticated gets no
        // session.
        if let (Identity::User { user, .. }, Some(nt_hash)) = (&outcome.identity, nt_hash)
            && server
                .lookup_user(user)
                .await
                .is_none_or(|c| c.nt_hash != nt_hash)
        {
            info!("user removed or changed during logon");
            return HandlerResponse::err(ntstatus::STATUS_LOGON_FAILURE);
        }
        session_arc
            .read()
            .await
            .add_channel(conn, None, *conn.signing_algo.read().await, None);
        sessions.insert(sid, session_arc);
    }

    if req.previous_session_id != 0 && req.previous_session_id != sid {
        close_previous_session(server, req.previous_session_id, &outcome.identity).await;
    }

    if dialect == Dialect::Smb311 {
        response.take_preauth_snapshot_for_session = Some(sid);
    }
    info!(%identity, "session established");
    response
}

/// Ends a successful binding: the user must be the session's (MS-SMB2
/// 3.3.5.5.3), and this connection becomes a channel of the session with
/// its own signing key, derived from this exchange's session key (for SMB
/// 3.1.1 with this connection's preauth hash, once known; the dispatcher
/// derives it before the response is signed with it).
async fn bind_channel(
    server: &ServerState,
    conn: &Arc<Connection>,
    sid: u64,
    session: &Arc<tokio::sync::RwLock<Session>>,
    outcome: &AuthOutcome,
    dialect: Dialect,
    mut response: HandlerResponse,
) -> HandlerResponse {
    let channel_session_key = &outcome.session_key;
    let (same, encrypt_data) = {
        let sess = session.read().await;
        (
            same_user(&sess.identity, &outcome.identity),
            sess.encrypt_data,
        )
    };
    if !same {
        info!("binding as another user refused");
        return HandlerResponse::err(ntstatus::STATUS_ACCESS_DENIED);
    }
    let algo = *conn.signing_algo.read().await;
    let (key, pending) = if dialect == Dialect::Smb311 {
        (None, Some(*channel_session_key))
    } else {
        (Some(signing_key_30(channel_session_key)), None)
    };
    // The session may have ended while this exchange ran.
    if crate::dispatch::find_session(server, sid)
        .await
        .is_none_or(|found| !Arc::ptr_eq(&found, session))
    {
        return HandlerResponse::err(ntstatus::STATUS_USER_SESSION_DELETED);
    }
    {
        let mut sessions = conn.sessions.write().await;
        if session_limit_reached(server, &sessions) {
            warn!("session limit reached on connection");
            return HandlerResponse::err(ntstatus::STATUS_INSUFFICIENT_RESOURCES);
        }
        sessions.insert(sid, Arc::clone(session));
    }
    session.read().await.add_channel(conn, key, algo, pending);
    if encrypt_data {
        let token = SessionSetupResponse::parse(&response.body)
            .map(|r| r.security_buffer)
            .unwrap_or_default();
        response.body = build_session_setup_response(
            ntstatus::STATUS_SUCCESS,
            &token,
            SessionSetupResponse::FLAG_ENCRYPT_DATA,
        );
    }
    if dialect == Dialect::Smb311 {
        response.take_preauth_snapshot_for_session = Some(sid);
    }
    info!(session = sid, "connection bound to session");
    response
}

fn session_limit_reached<T>(server: &ServerState, sessions: &HashMap<u64, T>) -> bool {
    sessions.len() >= server.auth.settings.max_sessions_per_connection
}

/// Ends a logon that failed with `status`: counts it against the connection
/// and, with `user` set, against that name and the client's address. Closes
/// the connection once it has failed too often, and removes a session that
/// was being reauthenticated (MS-SMB2 3.3.5.5.3), keeping its durable opens
/// as LOGOFF does.
async fn logon_failed(
    server: &ServerState,
    conn: &Connection,
    sid: u64,
    reauth: bool,
    user: Option<&str>,
    status: u32,
) -> HandlerResponse {
    if let Some(user) = user {
        server
            .auth
            .record_failure(user, conn.peer_addr.map(|a| a.ip()));
    }
    let failures = conn.logon_failures.fetch_add(1, Ordering::Relaxed) + 1;
    if server.auth.connection_exhausted(failures) {
        warn!(failures, "too many failed logons; closing the connection");
        conn.request_disconnect();
    }
    if reauth {
        conn.close_session(sid, Some(&server.durable)).await;
    }
    HandlerResponse::err(status)
}

/// True when both identities are the same configured user, or both are
/// anonymous.
fn same_user(a: &Identity, b: &Identity) -> bool {
    match (a, b) {
        (Identity::Anonymous, Identity::Anonymous) => true,
        (Identity::User { user: a, .. }, Identity::User { user: b, .. }) => a == b,
        _ => false,
    }
}

/// MS-SMB2 3.3.5.5.3: a logon that names a PreviousSessionId of the same
/// user ends that session, on whichever connection holds it, as if that
/// connection were lost (MS-SMB2 3.3.7.1): its durable opens are kept.
async fn close_previous_session(server: &ServerState, previous: u64, identity: &Identity) {
    if matches!(identity, Identity::Anonymous) {
        return;
    }
    for conn in server.active_connections.live().await {
        let old = conn.sessions.read().await.get(&previous).cloned();
        let Some(old) = old else {
            continue;
        };
        if same_user(&old.read().await.identity, identity) {
            info!(previous, "closing the session the client reconnected from");
            conn.close_session(previous, Some(&server.durable)).await;
        }
        return;
    }
}

/// Checks the client's mechListMIC and returns the server's, for an SPNEGO
/// exchange (RFC 4178 section 5, MS-SPNG 3.1.5.1). The MIC is exchanged
/// when the client sends one, when the AUTHENTICATE_MESSAGE carried an NTLM
/// MIC, or when NTLM was not the client's first choice; in the last case the
/// client's MIC is required. Anonymous logons have no key and exchange none.
fn mech_list_mic(
    acceptor: &NtlmServer,
    outcome: &AuthOutcome,
    client_mic: Option<&[u8]>,
) -> Result<Option<Vec<u8>>, u32> {
    let required = acceptor.mech_list_mic_required;
    let wanted = required || client_mic.is_some() || outcome.mic_present;
    let (Some(mech_list), false) = (
        acceptor.mech_list.as_deref(),
        matches!(outcome.identity, Identity::Anonymous),
    ) else {
        return Ok(None);
    };
    if !wanted {
        return Ok(None);
    }
    let key = &outcome.session_key;
    let client = NtlmMac::new(outcome.flags, key, Direction::ClientToServer);
    let server = NtlmMac::new(outcome.flags, key, Direction::ServerToClient);
    let (Some(mut client), Some(mut server)) = (client, server) else {
        if required || client_mic.is_some() {
            info!("mechListMIC needed but NTLM signing was not negotiated");
            return Err(ntstatus::STATUS_LOGON_FAILURE);
        }
        return Ok(None);
    };
    match client_mic {
        Some(mic) if !client.verify(mech_list, mic) => {
            info!("SPNEGO mechListMIC mismatch");
            return Err(ntstatus::STATUS_LOGON_FAILURE);
        }
        None if required => {
            info!("SPNEGO mechListMIC missing");
            return Err(ntstatus::STATUS_LOGON_FAILURE);
        }
        _ => {}
    }
    Ok(Some(server.mac(mech_list).to_vec()))
}

/// Session.SigningRequired (MS-SMB2 3.3.5.5.3): the client asked for
/// signing in SESSION_SETUP or NEGOTIATE, or the server requires it.
/// Anonymous sessions have no key and are never signed.
fn signing_required(
    server: &ServerState,
    conn: &Connection,
    req: &SessionSetupRequest,
    identity: &Identity,
) -> bool {
    if matches!(identity, Identity::Anonymous) {
        return false;
    }
    let should_sign = conn
        .client_negotiate
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .as_ref()
        .is_some_and(|n| n.should_sign());
    req.security_mode & SessionSetupRequest::SECURITY_SIGNING_REQUIRED != 0
        || should_sign
        || server.auth.settings.require_signing
}

/// The configured user an NTLM user name refers to. NTLM user names are not
/// case sensitive: an exact match wins, then the one name that matches
/// ignoring case. A name that matches several users only by case matches
/// none of them. Every entry is compared, so the time taken does not show
/// whether or how the name matched.
fn configured_user<'a>(
    users: &'a HashMap<String, UserCreds>,
    name: &str,
) -> Option<(&'a String, &'a UserCreds)> {
    let mut exact = None;
    let mut folded = None;
    let mut folded_count = 0usize;
    for user in users {
        if user.0 == name {
            exact = Some(user);
        }
        if eq_ignore_case(user.0, name) {
            folded = Some(user);
            folded_count += 1;
        }
    }
    exact.or(folded.filter(|_| folded_count == 1))
}

/// The user name of a guest logon.
const GUEST: &str = "guest";

/// True when a logon as `name` is a guest logon: the name is `guest` in any
/// case and no configured user has that name.
fn is_guest(users: &HashMap<String, UserCreds>, name: &str) -> bool {
    eq_ignore_case(name, GUEST) && !users.keys().any(|user| eq_ignore_case(user, GUEST))
}

fn eq_ignore_case(a: &str, b: &str) -> bool {
    a.chars()
        .flat_map(char::to_uppercase)
        .eq(b.chars().flat_map(char::to_uppercase))
}

/// Session.SigningKey for `dialect` (MS-SMB2 3.3.5.5.3). SMB 2.x signs with
/// the session key itself. For 3.1.1 the key is derived later, once the
/// preauth hash of this exchange is known.
fn signing_key(dialect: Dialect, session_key: &[u8; 16]) -> [u8; 16] {
    match dialect {
        Dialect::Smb311 => [0u8; 16],
        Dialect::Smb202 | Dialect::Smb210 | Dialect::Smb2Wildcard => *session_key,
        Dialect::Smb300 | Dialect::Smb302 => signing_key_30(session_key),
    }
}

fn build_session_setup_response(_status: u32, spnego_blob: &[u8], session_flags: u16) -> Vec<u8> {
    let resp = SessionSetupResponse {
        structure_size: 9,
        session_flags,
        security_buffer_offset: 64 + 8, // SMB2 header + fixed prefix
        security_buffer_length: spnego_blob.len() as u16,
        security_buffer: spnego_blob.to_vec(),
    };
    let mut buf = Vec::new();
    resp.write_to(&mut buf)
        .expect("SESSION_SETUP response encodes");
    debug!(len = buf.len(), "SESSION_SETUP response built");
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signing_key_per_dialect() {
        let key = [0x5A; 16];
        assert_eq!(signing_key(Dialect::Smb202, &key), key);
        assert_eq!(signing_key(Dialect::Smb210, &key), key);
        assert_eq!(signing_key(Dialect::Smb300, &key), signing_key_30(&key));
        assert_eq!(signing_key(Dialect::Smb302, &key), signing_key_30(&key));
    }

    #[test]
    fn configured_user_matches_case_insensitively_once() {
        let mut users = HashMap::new();
        users.insert("Alice".to_string(), UserCreds::from_password("a"));
        users.insert("bob".to_string(), UserCreds::from_password("b"));
        users.insert("BOB".to_string(), UserCreds::from_password("c"));
        assert_eq!(configured_user(&users, "alice").unwrap().0, "Alice");
        assert_eq!(configured_user(&users, "bob").unwrap().0, "bob");
        assert_eq!(configured_user(&users, "BOB").unwrap().0, "BOB");
        assert!(configured_user(&users, "Bob").is_none());
        assert!(configured_user(&users, "carol").is_none());
    }

    #[test]
    fn guest_is_the_name_guest_when_no_user_has_it() {
        let mut users = HashMap::new();
        users.insert("alice".to_string(), UserCreds::from_password("a"));
        for name in ["guest", "GUEST", "Guest"] {
            assert!(is_guest(&users, name), "{name}");
        }
        assert!(!is_guest(&users, "alice"));
        assert!(!is_guest(&users, "guests"));
        assert!(!is_guest(&users, ""));
        users.insert("Guest".to_string(), UserCreds::from_password("g"));
        assert!(!is_guest(&users, "guest"));
    }

    use crate::proto::auth::ntlm::testing::{AuthMsg, build_auth};
    use crate::proto::header::{Command, HeaderTail};
    use std::time::Duration;

    fn header(session_id: u64) -> Smb2Header {
        Smb2Header {
            credit_charge: 1,
            channel_sequence_status: 0,
            command: Command::SessionSetup,
            credit_request_response: 1,
            flags: 0,
            next_command: 0,
            message_id: 1,
            tail: HeaderTail::sync(0),
            session_id,
            signature: [0; 16],
        }
    }

    fn body(token: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        SessionSetupRequest {
            structure_size: 25,
            flags: 0,
            security_mode: 1,
            capabilities: 0,
            channel: 0,
            security_buffer_offset: 88,
            security_buffer_length: token.len() as u16,
            previous_session_id: 0,
            security_buffer: token.to_vec(),
        }
        .write_to(&mut body)
        .unwrap();
        body
    }

    fn ntlm_negotiate() -> Vec<u8> {
        let mut msg = NTLMSSP_SIGNATURE.to_vec();
        msg.extend_from_slice(&1u32.to_le_bytes());
        msg.extend_from_slice(&0x0008_0201u32.to_le_bytes());
        msg.extend_from_slice(&[0u8; 16]);
        msg
    }

    /// NTLMv2 AUTHENTICATE_MESSAGE answering the CHALLENGE_MESSAGE
    /// `challenge`, without a MIC or key exchange.
    fn ntlm_authenticate(challenge: &[u8], user: &str, password: &str) -> Vec<u8> {
        let m = AuthMsg {
            user,
            password,
            challenge: challenge[24..32].try_into().unwrap(),
            ..AuthMsg::default()
        };
        build_auth(&m).0
    }

    fn server(builder: crate::SmbServerBuilder) -> crate::SmbServer {
        builder
            .listen("127.0.0.1:0".parse().unwrap())
            .user("alice", "password")
            .build()
            .expect("build")
    }

    async fn connection(state: &Arc<ServerState>) -> Arc<Connection> {
        let conn = Arc::new(Connection::new(state.config.server_guid, 65536, 65536));
        state.active_connections.register(&conn).await;
        *conn.dialect.write().await = Some(Dialect::Smb210);
        conn
    }

    /// First round; returns the SessionId and the CHALLENGE_MESSAGE.
    async fn first_round(state: &Arc<ServerState>, conn: &Arc<Connection>) -> (u64, Vec<u8>) {
        let resp = handle(state, conn, &header(0), &body(&ntlm_negotiate())).await;
        assert_eq!(resp.status, ntstatus::STATUS_MORE_PROCESSING_REQUIRED);
        let sid = resp.override_session_id.unwrap();
        let challenge = SessionSetupResponse::parse(&resp.body)
            .unwrap()
            .security_buffer;
        (sid, challenge)
    }

    async fn logon(
        state: &Arc<ServerState>,
        conn: &Arc<Connection>,
        user: &str,
        password: &str,
    ) -> u32 {
        let (sid, challenge) = first_round(state, conn).await;
        let auth = ntlm_authenticate(&challenge, user, password);
        handle(state, conn, &header(sid), &body(&auth)).await.status
    }

    #[tokio::test]
    async fn repeated_failures_close_the_connection() {
        let server = server(crate::SmbServer::builder().logon_throttle(2, Duration::from_secs(60)));
        let state = server.state();
        let conn = connection(&state).await;
        assert_eq!(
            logon(&state, &conn, "alice", "wrong").await,
            ntstatus::STATUS_LOGON_FAILURE
        );
        assert!(!conn.disconnect_requested());
        assert_eq!(
            logon(&state, &conn, "nobody", "wrong").await,
            ntstatus::STATUS_LOGON_FAILURE
        );
        assert!(conn.disconnect_requested());
    }

    #[tokio::test]
    async fn sessions_per_connection_are_capped() {
        let server = server(crate::SmbServer::builder().max_sessions_per_connection(1));
        let state = server.state();
        let conn = connection(&state).await;
        assert_eq!(logon(&state, &conn, "alice", "password").await, 0);
        let resp = handle(&state, &conn, &header(0), &body(&ntlm_negotiate())).await;
        assert_eq!(resp.status, ntstatus::STATUS_INSUFFICIENT_RESOURCES);
    }

    /// A logon that authenticated before `remove_user` and inserts its
    /// session after the sweep does not leave a session behind.
    #[tokio::test]
    async fn logon_racing_remove_user_leaves_no_session() {
        let server = server(crate::SmbServer::builder());
        let state = server.state();
        let config = server.config_handle();
        let conn = connection(&state).await;
        let (sid, challenge) = first_round(&state, &conn).await;
        let auth = ntlm_authenticate(&challenge, "alice", "password");

        // Hold the dialect so the logon stops after authenticating.
        let dialect = conn.dialect.write().await;
        let logon = tokio::spawn({
            let (state, conn) = (state.clone(), conn.clone());
            async move {
                handle(&state, &conn, &header(sid), &body(&auth))
                    .await
                    .status
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        config.remove_user("alice").await.unwrap();
        drop(dialect);
        assert_ne!(logon.await.unwrap(), ntstatus::STATUS_SUCCESS);
        assert!(conn.sessions.read().await.is_empty());
    }

    // ---- Session binding (Aquifer patch).

    use crate::handlers::negotiate::{CAP_MULTI_CHANNEL, ClientNegotiate};

    const CLIENT_GUID: uuid::Uuid = uuid::Uuid::from_u128(0x5eed);

    /// An SMB 3.0 connection of the client `CLIENT_GUID` signing with
    /// AES-CMAC whose NEGOTIATE offered multichannel.
    async fn smb3_connection(state: &Arc<ServerState>) -> Arc<Connection> {
        let conn = connection(state).await;
        *conn.dialect.write().await = Some(Dialect::Smb300);
        *conn.signing_algo.write().await = SigningAlgo::AesCmac;
        *conn.client_guid.write().await = CLIENT_GUID;
        *conn.client_negotiate.lock().unwrap() = Some(ClientNegotiate {
            capabilities: CAP_MULTI_CHANNEL,
            security_mode: 1,
            guid: *CLIENT_GUID.as_bytes(),
            dialects: vec![0x0300],
        });
        conn
    }

    fn signed(mut hdr: Smb2Header) -> Smb2Header {
        hdr.flags |= SMB2_FLAGS_SIGNED;
        hdr
    }

    fn binding_body(token: &[u8]) -> Vec<u8> {
        let mut body = body(token);
        body[2] = SessionSetupRequest::FLAG_BINDING;
        body
    }

    /// Logs alice on to `conn` and returns her session.
    async fn alice_session(
        state: &Arc<ServerState>,
        conn: &Arc<Connection>,
    ) -> (u64, Arc<tokio::sync::RwLock<Session>>) {
        let (sid, challenge) = first_round(state, conn).await;
        let auth = ntlm_authenticate(&challenge, "alice", "password");
        let resp = handle(state, conn, &header(sid), &body(&auth)).await;
        assert_eq!(resp.status, ntstatus::STATUS_SUCCESS);
        let session = conn.sessions.read().await.get(&sid).cloned().unwrap();
        (sid, session)
    }

    /// Both rounds of a binding of `conn` to `sid` as `user`; returns the
    /// status of the last round run and the key of the exchange.
    async fn bind_as(
        state: &Arc<ServerState>,
        conn: &Arc<Connection>,
        sid: u64,
        user: &str,
        password: &str,
    ) -> (u32, [u8; 16]) {
        let hdr = signed(header(sid));
        let resp = handle(state, conn, &hdr, &binding_body(&ntlm_negotiate())).await;
        if resp.status != ntstatus::STATUS_MORE_PROCESSING_REQUIRED {
            return (resp.status, [0; 16]);
        }
        assert!(!resp.skip_signing, "interim binding response is signed");
        let challenge = SessionSetupResponse::parse(&resp.body)
            .unwrap()
            .security_buffer;
        let (auth, key) = build_auth(&AuthMsg {
            user,
            password,
            challenge: challenge[24..32].try_into().unwrap(),
            ..AuthMsg::default()
        });
        let resp = handle(state, conn, &hdr, &binding_body(&auth)).await;
        (resp.status, key)
    }

    /// Nothing of `conn` refers to session `sid`, which lives on with its
    /// one channel.
    async fn unbound(conn: &Connection, sid: u64, session: &Arc<tokio::sync::RwLock<Session>>) {
        assert!(!conn.sessions.read().await.contains_key(&sid));
        assert!(!conn.pending_auths.read().await.contains_key(&sid));
        let sess = session.read().await;
        assert!(!sess.has_channel(conn));
        assert_eq!(sess.channel_connections().len(), 1);
    }

    #[tokio::test]
    async fn a_binding_connection_becomes_a_channel_with_its_own_key() {
        let server = server(crate::SmbServer::builder());
        let state = server.state();
        let first = smb3_connection(&state).await;
        let (sid, session) = alice_session(&state, &first).await;
        let second = smb3_connection(&state).await;

        let (status, key) = bind_as(&state, &second, sid, "alice", "password").await;
        assert_eq!(status, ntstatus::STATUS_SUCCESS);
        let bound = second.sessions.read().await.get(&sid).cloned().unwrap();
        assert!(Arc::ptr_eq(&bound, &session));
        {
            let sess = session.read().await;
            assert_eq!(sess.channel_connections().len(), 2);
            let (channel_key, algo) = sess.signing_key_for(&second, SigningAlgo::AesCmac);
            assert_eq!(channel_key, signing_key_30(&key));
            assert_eq!(algo, SigningAlgo::AesCmac);
            // The first connection keeps the session's key.
            assert_eq!(
                sess.signing_key_for(&first, SigningAlgo::AesCmac).0,
                sess.signing_key
            );
        }
        // Binding the same connection again is refused.
        let hdr = signed(header(sid));
        let again = handle(&state, &second, &hdr, &binding_body(&ntlm_negotiate())).await;
        assert_eq!(again.status, ntstatus::STATUS_REQUEST_NOT_ACCEPTED);

        // The first connection closing leaves the session on the second.
        first.close_all(None).await;
        assert!(second.sessions.read().await.contains_key(&sid));
        assert_eq!(session.read().await.channel_connections().len(), 1);
        // Ending the session on its last channel removes it.
        assert!(second.close_session(sid, None).await);
        assert!(crate::dispatch::find_session(&state, sid).await.is_none());
    }

    #[tokio::test]
    async fn logoff_on_one_channel_ends_the_session_on_all() {
        let server = server(crate::SmbServer::builder());
        let state = server.state();
        let first = smb3_connection(&state).await;
        let (sid, _session) = alice_session(&state, &first).await;
        let second = smb3_connection(&state).await;
        assert_eq!(
            bind_as(&state, &second, sid, "alice", "password").await.0,
            ntstatus::STATUS_SUCCESS
        );
        assert!(second.close_session(sid, None).await);
        assert!(first.sessions.read().await.is_empty());
        assert!(second.sessions.read().await.is_empty());
    }

    #[tokio::test]
    async fn refused_bindings_change_nothing() {
        let server = server(crate::SmbServer::builder().user("bob", "bob-password"));
        let state = server.state();
        let first = smb3_connection(&state).await;
        let (sid, session) = alice_session(&state, &first).await;
        let negotiate = ntlm_negotiate();

        // No SessionId; an unknown one.
        let second = smb3_connection(&state).await;
        let resp = handle(
            &state,
            &second,
            &signed(header(0)),
            &binding_body(&negotiate),
        )
        .await;
        assert_eq!(resp.status, ntstatus::STATUS_INVALID_PARAMETER);
        let resp = handle(
            &state,
            &second,
            &signed(header(sid + 1)),
            &binding_body(&negotiate),
        )
        .await;
        assert_eq!(resp.status, ntstatus::STATUS_USER_SESSION_DELETED);
        // Unsigned.
        let resp = handle(&state, &second, &header(sid), &binding_body(&negotiate)).await;
        assert_eq!(resp.status, ntstatus::STATUS_INVALID_PARAMETER);
        // Another user, a wrong password, an empty or garbage token.
        assert_eq!(
            bind_as(&state, &second, sid, "bob", "bob-password").await.0,
            ntstatus::STATUS_ACCESS_DENIED
        );
        assert_eq!(
            bind_as(&state, &second, sid, "alice", "wrong").await.0,
            ntstatus::STATUS_LOGON_FAILURE
        );
        let resp = handle(&state, &second, &signed(header(sid)), &binding_body(&[])).await;
        assert_eq!(resp.status, ntstatus::STATUS_INVALID_PARAMETER);
        let resp = handle(
            &state,
            &second,
            &signed(header(sid)),
            &binding_body(&[0xA1, 0xFF]),
        )
        .await;
        assert_eq!(resp.status, ntstatus::STATUS_LOGON_FAILURE);
        unbound(&second, sid, &session).await;

        // Connections that do not match the session's.
        for (what, status) in [
            ("SMB 2.1", ntstatus::STATUS_REQUEST_NOT_ACCEPTED),
            ("SMB 3.0.2", ntstatus::STATUS_INVALID_PARAMETER),
            ("cipher", ntstatus::STATUS_INVALID_PARAMETER),
            ("client guid", ntstatus::STATUS_USER_SESSION_DELETED),
            ("no multichannel", ntstatus::STATUS_REQUEST_NOT_ACCEPTED),
            ("AES-GMAC", ntstatus::STATUS_NOT_SUPPORTED),
        ] {
            let conn = smb3_connection(&state).await;
            match what {
                "SMB 2.1" => {
                    *conn.dialect.write().await = Some(Dialect::Smb210);
                    *conn.signing_algo.write().await = SigningAlgo::HmacSha256;
                }
                "SMB 3.0.2" => *conn.dialect.write().await = Some(Dialect::Smb302),
                "cipher" => {
                    *conn.cipher.write().await = Some(crate::proto::crypto::Cipher::Aes128Ccm)
                }
                "client guid" => *conn.client_guid.write().await = uuid::Uuid::from_u128(7),
                "no multichannel" => {
                    conn.client_negotiate
                        .lock()
                        .unwrap()
                        .as_mut()
                        .unwrap()
                        .capabilities = 0
                }
                _ => {
                    *conn.dialect.write().await = Some(Dialect::Smb311);
                    *conn.signing_algo.write().await = SigningAlgo::AesGmac;
                }
            }
            let resp = handle(
                &state,
                &conn,
                &signed(header(sid)),
                &binding_body(&negotiate),
            )
            .await;
            assert_eq!(resp.status, status, "{what}");
            unbound(&conn, sid, &session).await;
        }

        // A session established with AES-GMAC binds only AES-GMAC.
        let gmac = smb3_connection(&state).await;
        *gmac.dialect.write().await = Some(Dialect::Smb311);
        *gmac.signing_algo.write().await = SigningAlgo::AesGmac;
        let (gmac_sid, challenge) = first_round(&state, &gmac).await;
        let auth = ntlm_authenticate(&challenge, "alice", "password");
        assert_eq!(
            handle(&state, &gmac, &header(gmac_sid), &body(&auth))
                .await
                .status,
            ntstatus::STATUS_SUCCESS
        );
        let cmac = smb3_connection(&state).await;
        *cmac.dialect.write().await = Some(Dialect::Smb311);
        let resp = handle(
            &state,
            &cmac,
            &signed(header(gmac_sid)),
            &binding_body(&negotiate),
        )
        .await;
        assert_eq!(resp.status, ntstatus::STATUS_REQUEST_OUT_OF_SEQUENCE);
        assert!(cmac.sessions.read().await.is_empty());

        // The session still serves its first connection alone.
        assert!(first.sessions.read().await.contains_key(&sid));
    }

    #[tokio::test]
    async fn guest_sessions_are_not_bound() {
        let server = server(crate::SmbServer::builder());
        let state = server.state();
        let first = smb3_connection(&state).await;
        let (sid, session) = alice_session(&state, &first).await;
        session.write().await.origin.as_mut().unwrap().guest = true;
        let second = smb3_connection(&state).await;
        let resp = handle(
            &state,
            &second,
            &signed(header(sid)),
            &binding_body(&ntlm_negotiate()),
        )
        .await;
        assert_eq!(resp.status, ntstatus::STATUS_NOT_SUPPORTED);
        unbound(&second, sid, &session).await;
    }

    /// smbtorture's `ntlmssp_bug14932`: an NTLMv2 response whose
    /// NTLMv2_CLIENT_CHALLENGE does not parse is malformed, not a wrong
    /// password.
    #[tokio::test]
    async fn a_malformed_ntlmv2_response_is_invalid_parameter() {
        let server = server(crate::SmbServer::builder());
        let state = server.state();
        let conn = connection(&state).await;
        let mut bad_types = vec![0xAB; 16];
        bad_types.extend_from_slice(&[2, 2, 0, 0, 0, 0, 0, 0]);
        bad_types.extend_from_slice(&[0; 20]);
        bad_types.extend_from_slice(&[0; 4]);
        let mut truncated_pairs = vec![0xAB; 16];
        truncated_pairs.extend_from_slice(&[1, 1, 0, 0, 0, 0, 0, 0]);
        truncated_pairs.extend_from_slice(&[0; 20]);
        truncated_pairs.extend_from_slice(&[0x11, 0xa2, 0x08, 0x81, 0x50]);
        for nt in [bad_types, truncated_pairs, vec![0xAB; 40]] {
            let (sid, challenge) = first_round(&state, &conn).await;
            let (auth, _) = build_auth(&AuthMsg {
                user: "alice",
                password: "password",
                nt: Some(&nt),
                challenge: challenge[24..32].try_into().unwrap(),
                ..AuthMsg::default()
            });
            let resp = handle(&state, &conn, &header(sid), &body(&auth)).await;
            assert_eq!(resp.status, ntstatus::STATUS_INVALID_PARAMETER);
        }
        assert!(conn.sessions.read().await.is_empty());
    }
}
