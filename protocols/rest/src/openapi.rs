//! The OpenAPI 3 document of the API, maintained by hand next to the routes. A test checks
//! that it names exactly the routes the router serves (see `served_routes`).

use axum::Json;
use serde_json::{Map, Value, json};

/// Axum path syntax to OpenAPI's: `{*path}` becomes `{path}`.
pub(crate) fn openapi_path(axum_path: &str) -> String {
    axum_path.replace("{*", "{")
}

pub(crate) async fn get_openapi() -> Json<Value> {
    Json(document())
}

/// Any JSON object (routes whose bodies are documented in their summary).
pub(crate) fn object_schema() -> Value {
    json!({ "type": "object" })
}

pub(crate) fn array_of_any() -> Value {
    json!({ "type": "array", "items": { "type": "object" } })
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn array_of(name: &str) -> Value {
    json!({ "type": "array", "items": schema_ref(name) })
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn error_response(description: &str) -> Value {
    json!({ "description": description, "content": json_content(schema_ref("Error")) })
}

/// One operation. `ok` is (status, description, response schema or none).
pub(crate) struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    tag: &'static str,
    public: bool,
    params: Vec<Value>,
    body: Option<Value>,
    ok: (&'static str, &'static str, Option<Value>),
}

pub(crate) fn path_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "string" } })
}

pub(crate) fn query_param(name: &str, ty: &str, description: &str) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": { "type": ty } })
}

fn header_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "header", "required": false, "description": description, "schema": { "type": "string" } })
}

pub(crate) fn op(method: &'static str, path: &'static str, tag: &'static str, summary: &'static str) -> Op {
    Op { method, path, summary, tag, public: false, params: vec![], body: None, ok: ("200", "OK", None) }
}

impl Op {
    pub(crate) fn params(mut self, p: Vec<Value>) -> Op {
        self.params = p;
        self
    }
    pub(crate) fn body(mut self, schema: Value) -> Op {
        self.body = Some(json!({ "required": true, "content": json_content(schema) }));
        self
    }
    fn raw_body(mut self, description: &'static str) -> Op {
        self.body = Some(json!({
            "required": true,
            "description": description,
            "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } }
        }));
        self
    }
    pub(crate) fn ok(mut self, status: &'static str, description: &'static str, schema: Option<Value>) -> Op {
        self.ok = (status, description, schema);
        self
    }
    fn public(mut self) -> Op {
        self.public = true;
        self
    }
}

fn operations() -> Vec<Op> {
    let index = || vec![path_param("index", "drive slot index")];
    let name = || vec![path_param("name", "user or group name")];
    let job_id = || vec![path_param("id", "job id")];
    let fpath = || vec![path_param("path", "file path below the root, '/'-separated, percent-encoded per component")];
    vec![
        op("get", "/api/v1/health", "health", "Overall state, notes and per-drive state")
            .public()
            .ok("200", "health", Some(schema_ref("Health"))),
        op("post", "/api/v1/auth/tokens", "auth", "Issue an API token; the secret is returned only here")
            .body(schema_ref("NewToken"))
            .ok("201", "token issued", Some(schema_ref("TokenIssued"))),
        op("get", "/api/v1/auth/tokens", "auth", "List tokens (own tokens; all for read-only and above)")
            .ok("200", "tokens", Some(array_of("Token"))),
        op("delete", "/api/v1/auth/tokens/{id}", "auth", "Revoke a token")
            .params(vec![path_param("id", "token id")])
            .ok("204", "revoked", None),
        op("get", "/api/v1/drives", "drives", "List drives (read-only role)").ok("200", "drives", Some(array_of("Drive"))),
        op("get", "/api/v1/drives/{index}", "drives", "One drive (read-only role)")
            .params(index())
            .ok("200", "drive", Some(schema_ref("Drive"))),
        op("post", "/api/v1/drives/{index}/replace", "drives", "Replace a drive and start rebuilding onto it (operator role); body optional")
            .params(index())
            .body(schema_ref("ReplaceDrive"))
            .ok("202", "rebuild started", Some(schema_ref("JobStarted"))),
        op("post", "/api/v1/drives/{index}/fail", "drives", "Take a drive out of service (operator role)")
            .params(index())
            .body(schema_ref("FailDrive"))
            .ok("200", "drive", Some(schema_ref("Drive"))),
        op("get", "/api/v1/pools", "capacity", "Storage pools (read-only role)").ok("200", "pools", Some(array_of("Pool"))),
        op("get", "/api/v1/capacity", "capacity", "Usable and raw capacity (read-only role)")
            .ok("200", "capacity", Some(schema_ref("Capacity"))),
        op("get", "/api/v1/cache", "capacity", "The data cache: bytes kept, hits and misses (read-only role)")
            .ok("200", "data cache", Some(schema_ref("DataCache"))),
        op("get", "/api/v1/users", "identities", "List users (read-only role)").ok("200", "users", Some(array_of("User"))),
        op("post", "/api/v1/users", "identities", "Create a user (admin role)")
            .body(schema_ref("NewUser"))
            .ok("201", "user created", Some(schema_ref("User"))),
        op("get", "/api/v1/users/{name}", "identities", "One user (oneself, or read-only role)")
            .params(name())
            .ok("200", "user", Some(schema_ref("User"))),
        op("patch", "/api/v1/users/{name}", "identities", "Change a user (own password, or admin role)")
            .params(name())
            .body(schema_ref("UserPatch"))
            .ok("200", "user", Some(schema_ref("User"))),
        op("delete", "/api/v1/users/{name}", "identities", "Delete a user and its tokens (admin role)")
            .params(name())
            .ok("204", "deleted", None),
        op("post", "/api/v1/users/{name}/s3-keys", "identities", "Issue an S3 key pair (oneself, or admin role); body empty or both fields")
            .params(name())
            .body(schema_ref("NewS3Key"))
            .ok("201", "key issued; the secret is shown once", Some(schema_ref("S3KeyIssued"))),
        op("get", "/api/v1/s3-keys", "identities", "S3 access keys (one's own, or all with read-only role)")
            .ok("200", "keys", Some(array_of("S3Key"))),
        op("delete", "/api/v1/s3-keys/{access_key}", "identities", "Delete an S3 access key (its owner, or admin role)")
            .params(vec![path_param("access_key", "access key id")])
            .ok("204", "deleted", None),
        op("post", "/api/v1/users/{name}/ssh-keys", "identities", "Add an SSH public key for SFTP login (oneself, or admin role)")
            .params(name())
            .body(schema_ref("NewSshKey"))
            .ok("201", "key added", Some(schema_ref("SshKey"))),
        op("get", "/api/v1/users/{name}/ssh-keys", "identities", "A user's SSH public keys (oneself, or read-only role)")
            .params(name())
            .ok("200", "keys", Some(array_of("SshKey"))),
        op("delete", "/api/v1/users/{name}/ssh-keys/{id}", "identities", "Remove an SSH public key (oneself, or admin role)")
            .params(vec![path_param("name", "user name"), path_param("id", "key id")])
            .ok("204", "removed", None),
        op("get", "/api/v1/groups", "identities", "List groups (read-only role)").ok("200", "groups", Some(array_of("Group"))),
        op("post", "/api/v1/groups", "identities", "Create a group (admin role)")
            .body(schema_ref("NewGroup"))
            .ok("201", "group created", Some(schema_ref("Group"))),
        op("delete", "/api/v1/groups/{name}", "identities", "Delete a group (admin role)")
            .params(name())
            .ok("204", "deleted", None),
        op("get", "/api/v1/jobs", "jobs", "List jobs, newest first (read-only role)").ok("200", "jobs", Some(array_of("Job"))),
        op("post", "/api/v1/jobs", "jobs", "Start a scrub or a rebuild (operator role)")
            .body(schema_ref("NewJob"))
            .ok("202", "job started", Some(schema_ref("JobStarted"))),
        op("get", "/api/v1/jobs/{id}", "jobs", "One job with progress and counters (read-only role)")
            .params(job_id())
            .ok("200", "job", Some(schema_ref("Job"))),
        op("post", "/api/v1/jobs/{id}/cancel", "jobs", "Cancel a running job (operator role)")
            .params(job_id())
            .ok("200", "job", Some(schema_ref("Job"))),
        op("put", "/api/v1/files/{path}", "files", "Upload a file atomically, creating missing parent directories")
            .params(fpath())
            .raw_body("file content, streamed")
            .ok("201", "created (200 when an existing file was replaced)", Some(schema_ref("FileAttrs"))),
        op("get", "/api/v1/files/{path}", "files", "Download a file; single byte ranges give 206")
            .params([fpath(), vec![header_param("Range", "bytes=a-b, bytes=a- or bytes=-n"), header_param("If-None-Match", "entity tag")]].concat())
            .ok("200", "content (206 for a range, 304 when the entity tag matches, 416 for an unsatisfiable range)", Some(json!({ "type": "string", "format": "binary" }))),
        op("head", "/api/v1/files/{path}", "files", "File headers: Content-Length, ETag, Last-Modified, X-Aquifer-Ino/Version/Mode/Uid/Gid")
            .params(fpath())
            .ok("200", "headers only", None),
        op("delete", "/api/v1/files/{path}", "files", "Delete a file or symbolic link")
            .params(fpath())
            .ok("204", "deleted", None),
        op("post", "/api/v1/files/{path}", "files", "Rename (move) a file or directory, also across directories")
            .params(fpath())
            .body(schema_ref("Rename"))
            .ok("200", "attributes at the new path", Some(schema_ref("FileAttrs"))),
        op("get", "/api/v1/dirs", "files", "List the root directory")
            .params(vec![
                query_param("cursor", "string", "next_cursor of the previous page"),
                query_param("limit", "integer", "entries per page, default 1000, at most 10000"),
            ])
            .ok("200", "listing", Some(schema_ref("DirListing"))),
        op("get", "/api/v1/dirs/{path}", "files", "List a directory")
            .params([
                fpath(),
                vec![
                    query_param("cursor", "string", "next_cursor of the previous page"),
                    query_param("limit", "integer", "entries per page, default 1000, at most 10000"),
                ],
            ]
            .concat())
            .ok("200", "listing", Some(schema_ref("DirListing"))),
        op("post", "/api/v1/dirs/{path}", "files", "Make a directory; parents=true also makes missing parents")
            .params([fpath(), vec![query_param("parents", "boolean", "make missing parents; an existing directory is not an error")]].concat())
            .ok("201", "created (200 with parents=true when it existed)", Some(schema_ref("FileAttrs"))),
        op("delete", "/api/v1/dirs/{path}", "files", "Remove an empty directory")
            .params(fpath())
            .ok("204", "removed", None),
        op("get", "/api/v1/openapi.json", "meta", "This document").public().ok("200", "OpenAPI 3 document", Some(json!({ "type": "object" }))),
    ]
    .into_iter()
    .chain(crate::portals::operations())
    .chain(crate::exports::operations())
    .chain(crate::shares::operations())
    .chain(crate::chroots::operations())
    .collect()
}

fn obj(props: &[(&str, Value)], required: &[&str]) -> Value {
    let mut m = Map::new();
    for (k, v) in props {
        m.insert(k.to_string(), v.clone());
    }
    json!({ "type": "object", "properties": m, "required": required })
}

fn t(ty: &str) -> Value {
    json!({ "type": ty })
}

fn schemas() -> Value {
    let int = || t("integer");
    let s = || t("string");
    let b = || t("boolean");
    let ints = || json!({ "type": "array", "items": { "type": "integer" } });
    let role = || json!({ "type": "string", "enum": ["user", "read-only", "operator", "admin"] });
    json!({
        "Error": obj(&[("error", s()), ("message", s())], &["error", "message"]),
        "Health": obj(&[
            ("state", json!({ "type": "string", "enum": ["ok", "degraded", "failed"] })),
            ("notes", json!({ "type": "array", "items": { "type": "string" } })),
            ("drives", json!({ "type": "array", "items": obj(&[("index", int()), ("state", s()), ("reason", s())], &["index", "state"]) })),
        ], &["state", "notes", "drives"]),
        "Drive": obj(&[
            ("index", int()), ("path", s()), ("uuid", s()), ("epoch", int()), ("pool", s()),
            ("state", json!({ "type": "string", "enum": ["online", "failed", "rebuilding"] })), ("reason", s()),
            ("backend", s()), ("capacity_bytes", int()), ("used_bytes", int()), ("read_errors", int()),
            ("write_errors", int()), ("checksum_errors", int()), ("repaired_shards", int()),
        ], &["index", "path", "uuid", "epoch", "pool", "state", "backend", "capacity_bytes", "used_bytes"]),
        "ReplaceDrive": obj(&[("path", s()), ("size_bytes", int())], &[]),
        "FailDrive": obj(&[("reason", s())], &["reason"]),
        "JobStarted": obj(&[("job_id", int())], &["job_id"]),
        "Pool": obj(&[
            ("name", s()), ("data_shards", int()), ("parity_shards", int()), ("drives", ints()),
            ("raw_capacity_bytes", int()), ("raw_used_bytes", int()),
        ], &["name", "data_shards", "parity_shards", "drives", "raw_capacity_bytes", "raw_used_bytes"]),
        "DataCache": obj(&[
            ("max_bytes", int()), ("bytes", int()), ("entries", int()), ("hits", int()), ("misses", int()),
        ], &["max_bytes", "bytes", "entries", "hits", "misses"]),
        "Capacity": obj(&[
            ("total_bytes", int()), ("free_bytes", int()), ("used_bytes", int()), ("files", int()),
            ("raw_total_bytes", int()), ("raw_free_bytes", int()),
        ], &["total_bytes", "free_bytes", "used_bytes", "files", "raw_total_bytes", "raw_free_bytes"]),
        "User": obj(&[("name", s()), ("uid", int()), ("gid", int()), ("groups", ints()), ("role", role()), ("disabled", b())],
            &["name", "uid", "gid", "groups", "role", "disabled"]),
        "NewUser": obj(&[("name", s()), ("password", s()), ("uid", int()), ("gid", int()), ("groups", ints()), ("role", role())],
            &["name", "password"]),
        "UserPatch": obj(&[("password", s()), ("groups", ints()), ("role", role()), ("disabled", b())], &[]),
        "Group": obj(&[("name", s()), ("gid", int())], &["name", "gid"]),
        "NewGroup": obj(&[("name", s()), ("gid", int())], &["name"]),
        "NewToken": obj(&[("user", s()), ("role", role()), ("ttl_secs", int()), ("label", s())], &[]),
        "Token": obj(&[("id", s()), ("user", s()), ("role", role()), ("created_ns", int()), ("expires_ns", int()), ("label", s())],
            &["id", "user", "role", "created_ns", "label"]),
        "TokenIssued": obj(&[("token", s()), ("info", schema_ref("Token"))], &["token", "info"]),
        "NewS3Key": obj(&[("access_key", s()), ("secret_key", s())], &[]),
        "S3KeyIssued": obj(&[("access_key", s()), ("secret_key", s())], &["access_key", "secret_key"]),
        "S3Key": obj(&[("access_key", s()), ("user", s()), ("created_ns", int())], &["access_key", "user", "created_ns"]),
        "NewSshKey": obj(&[("key", s())], &["key"]),
        "SshKey": obj(&[("id", s()), ("key", s())], &["id", "key"]),
        "NewJob": obj(&[("kind", json!({ "type": "string", "enum": ["scrub", "rebuild"] })), ("drive", int()), ("bytes_per_sec_max", int())], &["kind"]),
        "Job": obj(&[
            ("id", int()), ("kind", json!({ "type": "string", "enum": ["scrub", "rebuild"] })), ("drive", int()),
            ("state", json!({ "type": "string", "enum": ["running", "completed", "failed", "cancelled"] })), ("error", s()),
            ("progress", json!({ "type": "number", "minimum": 0, "maximum": 1 })), ("started_ns", int()), ("finished_ns", int()),
            ("stripes_total", int()), ("stripes_done", int()), ("bytes_done", int()), ("shards_bad", int()),
            ("shards_repaired", int()), ("stripes_unrecoverable", int()), ("bytes_per_sec_max", int()),
        ], &["id", "kind", "state", "progress", "started_ns", "finished_ns", "stripes_total", "stripes_done"]),
        "FileAttrs": obj(&[
            ("ino", int()), ("kind", json!({ "type": "string", "enum": ["file", "dir", "symlink"] })), ("mode", int()),
            ("uid", int()), ("gid", int()), ("nlink", int()), ("size", int()), ("atime_ns", int()), ("mtime_ns", int()),
            ("ctime_ns", int()), ("version", int()), ("etag", s()),
        ], &["ino", "kind", "mode", "uid", "gid", "nlink", "size", "mtime_ns", "version", "etag"]),
        "DirListing": obj(&[
            ("path", s()),
            ("entries", json!({ "type": "array", "items": obj(&[
                ("name", s()), ("ino", int()), ("kind", s()), ("size", int()), ("mode", int()), ("mtime_ns", int()),
            ], &["name", "ino", "kind", "size", "mode", "mtime_ns"]) })),
            ("next_cursor", s()),
        ], &["path", "entries"]),
        "Rename": obj(&[("rename_to", s())], &["rename_to"]),
    })
}

/// The whole document.
pub(crate) fn document() -> Value {
    let mut paths = Map::new();
    for o in operations() {
        let mut responses = Map::new();
        let (status, description, schema) = o.ok;
        let mut ok = json!({ "description": description });
        if let Some(schema) = schema {
            ok["content"] = json_content(schema);
        }
        responses.insert(status.to_string(), ok);
        if !o.public {
            responses.insert("401".into(), error_response("no or wrong credentials"));
            responses.insert("403".into(), error_response("permission denied"));
        }
        responses.insert("400".into(), error_response("invalid request or name"));
        responses.insert("404".into(), error_response("not found"));
        responses.insert("default".into(), error_response("error"));
        let mut operation = json!({
            "summary": o.summary,
            "tags": [o.tag],
            "operationId": format!("{}{}", o.method, o.path.replace(['/', '{', '}', '.'], "_")),
            "parameters": o.params,
            "responses": responses,
        });
        if let Some(body) = o.body {
            operation["requestBody"] = body;
        }
        if o.public {
            operation["security"] = json!([]);
        }
        let item = paths.entry(o.path.to_string()).or_insert_with(|| json!({}));
        item[o.method] = operation;
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Aquifer REST API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Admin API and REST file API of an Aquifer storage appliance. Errors are {\"error\": code, \"message\": text}."
        },
        "servers": [{ "url": "/" }],
        "security": [{ "basic": [] }, { "bearer": [] }],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "basic": { "type": "http", "scheme": "basic" },
                "bearer": { "type": "http", "scheme": "bearer", "description": "API token from POST /api/v1/auth/tokens" }
            },
            "schemas": schemas()
        }
    })
}
