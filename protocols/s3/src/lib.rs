//! Aquifer's S3 adapter (DESIGN.md §4): buckets are top-level directories of the namespace,
//! object keys are paths below them. Built on `s3s`, which parses the wire and checks SigV4
//! (headers, presigned URLs, streaming chunks); this crate maps each operation onto the
//! storage engine, whose blocking API it calls through `spawn_blocking`. The exceptions are
//! the few metadata reads of authenticating and authorising a request (the access key, the
//! bucket's policy and ACL) and of looking up the object of a GET or HEAD, made where the
//! request is served while no portal mirror could send one of them to a hub
//! (`Engine::holds_mirrors`), and the bytes of a small object that lie in the metadata store
//! (`Engine::try_read_inline`, which declines mirrors itself): for small requests the trip
//! to the blocking pool cost more than the reads. Likewise a small PUT whose object the
//! engine keeps in the metadata store is stored where it is served
//! (`Engine::try_put_inline`, which declines whatever could wait) and answered once an
//! `Engine::durable` future says its batch is synced.
//!
//! Authentication: an access key is looked up with `Engine::s3_credentials` and the request
//! runs as that key's user, so the engine checks every permission. A bucket policy (see
//! `policy`) can deny a request, or allow it with the bucket owner's permissions. Anonymous
//! requests no policy allows are refused unless the bucket is marked public-read (see
//! [`meta`]), and then only reads. An ACL beyond private/public-read (see `acl`) is stored
//! with its bucket or object and decides requests to it the same way: a grant runs the
//! request with the owner's permissions.
//!
//! Bodies stream: uploads go to the engine in [`PUT_CHUNK_BYTES`] pieces, downloads come
//! from it in a first [`READ_PIECE_BYTES_MAX`] piece and then 16 MiB windows, two in flight,
//! within a budget for all downloads together (one piece at a time past it), so memory per
//! request does not grow with the object. The exception is a browser upload (POST Object): s3s holds its file in memory, at
//! most [`POST_OBJECT_BYTES_MAX`] (see `post`). See `README.md` in this crate for the
//! decisions S3 clients can observe.

mod acl;
mod auth;
mod cors;
mod error;
mod form;
mod keys;
mod lifecycle;
mod md5;
pub mod meta;
mod policy;
mod post;
mod server;
mod service;
mod vhost;

pub use acl::ACL_GRANTS_MAX;
pub use keys::KEY_BYTES_MAX;
pub use meta::{TAG_KEY_BYTES_MAX, TAG_VALUE_BYTES_MAX, TAGS_MAX};
pub use lifecycle::{LIFECYCLE_RULES_MAX, lifecycle_pass, lifecycle_pass_with_day};
pub use policy::POLICY_BYTES_MAX;
pub use form::FORM_PARTS_MAX;
pub use post::{FORM_FIELDS_BYTES_MAX, POST_OBJECT_BYTES_MAX};
pub use server::{CONNECTIONS_MAX, SHUTDOWN_GRACE_MS, serve};
pub use service::{LIST_KEYS_DEFAULT, PART_BYTES_MIN, PUT_CHUNK_BYTES, READ_PIECE_BYTES_MAX, SMALL_PUT_BYTES};

/// Checks a virtual-host domain (`S3Options::domain`) as the listener will when it starts: a
/// DNS name without a port.
pub fn check_domain(domain: &str) -> anyhow::Result<()> {
    vhost::Domain::new(domain).map(|_| ())
}

/// How the S3 listener behaves.
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// Base domain for virtual-host style requests (`bucket.DOMAIN`); path style always works.
    pub domain: Option<String>,
    /// Length of a lifecycle day in seconds; `None` is a real day (86,400). Shorter days
    /// are for trying lifecycle rules out (`aquifer serve --s3-lifecycle-day-secs`).
    pub lifecycle_day_secs: Option<u64>,
    /// How long a request's body may go without a byte arriving before the request fails with
    /// `400 RequestTimeout` and its connection is closed; `None` is
    /// [`server::BODY_IDLE_TIMEOUT_MS`].
    pub body_idle_timeout_ms: Option<u64>,
}
