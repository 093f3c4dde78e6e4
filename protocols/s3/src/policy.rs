//! Bucket policies: the subset of the IAM policy language that S3 bucket policies use,
//! parsed and checked when a policy is put, and evaluated for every request on the bucket.
//!
//! Evaluation follows IAM: an explicit `Deny` that matches the request wins; otherwise an
//! `Allow` that matches grants; otherwise the policy says nothing ([`Decision::NoMatch`]) and
//! the caller's own permissions decide. A statement matches when its principal, action,
//! resource and every condition match. Whatever cannot be evaluated for sure (a condition
//! operator this code does not know, a value that does not parse as the operator needs)
//! makes an `Allow` statement not match and a `Deny` statement match, so a policy never
//! grants by mistake.
//!
//! What a grant means is decided by the caller of [`Policy::evaluate`] (see `auth.rs`): the
//! request runs with the bucket owner's permissions, as the owner delegated them.

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::Value;

/// Largest policy document accepted (as S3: 20 KiB).
pub const POLICY_BYTES_MAX: usize = 20 * 1024;
/// Most statements in one policy; a document within [`POLICY_BYTES_MAX`] cannot hold many
/// more, the bound only keeps evaluation cost obvious.
const STATEMENTS_MAX: usize = 1000;

/// Why a policy document was refused (answered as `400 MalformedPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError(pub String);

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad(msg: impl Into<String>) -> PolicyError {
    PolicyError(msg.into())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A `Deny` statement matched.
    Deny,
    /// An `Allow` statement matched and no `Deny` did.
    Allow,
    /// No statement matched: the caller's own permissions decide.
    NoMatch,
}

/// Who sends a request, as far as a policy's `Principal` can name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub uid: u32,
    pub user: String,
    pub access_key: String,
}

/// The values of the condition keys a request has; keys are stored in canonical form
/// (see [`canonical_key`]), a key may have several values (tag keys, for instance).
#[derive(Debug, Clone, Default)]
pub struct Context {
    values: HashMap<String, Vec<String>>,
}

impl Context {
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.values.insert(canonical_key(key), vec![value.into()]);
    }

    pub fn add(&mut self, key: &str, value: impl Into<String>) {
        self.values.entry(canonical_key(key)).or_default().push(value.into());
    }

    fn get(&self, key: &str) -> Option<&[String]> {
        self.values.get(key).map(Vec::as_slice)
    }
}

/// Condition keys are case-insensitive up to the first `/`; what follows it (a tag key, for
/// `s3:ExistingObjectTag/<key>`) is compared as written.
fn canonical_key(key: &str) -> String {
    match key.split_once('/') {
        Some((k, rest)) => format!("{}/{rest}", k.to_ascii_lowercase()),
        None => key.to_ascii_lowercase(),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Principals {
    /// `"*"` or `{"AWS": "*"}`: everyone, anonymous clients included.
    Everyone,
    /// Identifiers from `AWS` and `CanonicalUser`; other kinds (`Service`, `Federated`) name
    /// nobody Aquifer knows and are kept out, so they match nothing.
    Ids(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    StringEquals,
    StringNotEquals,
    StringEqualsIgnoreCase,
    StringNotEqualsIgnoreCase,
    StringLike,
    StringNotLike,
    NumericEquals,
    NumericNotEquals,
    NumericLessThan,
    NumericLessThanEquals,
    NumericGreaterThan,
    NumericGreaterThanEquals,
    DateEquals,
    DateNotEquals,
    DateLessThan,
    DateLessThanEquals,
    DateGreaterThan,
    DateGreaterThanEquals,
    Bool,
    IpAddress,
    NotIpAddress,
    ArnEquals,
    ArnLike,
    ArnNotEquals,
    ArnNotLike,
    Null,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        use Op::*;
        Some(match s {
            "StringEquals" => StringEquals,
            "StringNotEquals" => StringNotEquals,
            "StringEqualsIgnoreCase" => StringEqualsIgnoreCase,
            "StringNotEqualsIgnoreCase" => StringNotEqualsIgnoreCase,
            "StringLike" => StringLike,
            "StringNotLike" => StringNotLike,
            "NumericEquals" => NumericEquals,
            "NumericNotEquals" => NumericNotEquals,
            "NumericLessThan" => NumericLessThan,
            "NumericLessThanEquals" => NumericLessThanEquals,
            "NumericGreaterThan" => NumericGreaterThan,
            "NumericGreaterThanEquals" => NumericGreaterThanEquals,
            "DateEquals" => DateEquals,
            "DateNotEquals" => DateNotEquals,
            "DateLessThan" => DateLessThan,
            "DateLessThanEquals" => DateLessThanEquals,
            "DateGreaterThan" => DateGreaterThan,
            "DateGreaterThanEquals" => DateGreaterThanEquals,
            "Bool" => Bool,
            "IpAddress" => IpAddress,
            "NotIpAddress" => NotIpAddress,
            "ArnEquals" => ArnEquals,
            "ArnLike" => ArnLike,
            "ArnNotEquals" => ArnNotEquals,
            "ArnNotLike" => ArnNotLike,
            "Null" => Null,
            _ => return None,
        })
    }

    /// Negated operators match a request that lacks the key (as IAM).
    fn negated(self) -> bool {
        matches!(self, Op::StringNotEquals | Op::StringNotEqualsIgnoreCase | Op::StringNotLike | Op::NumericNotEquals | Op::DateNotEquals | Op::NotIpAddress | Op::ArnNotEquals | Op::ArnNotLike)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetOp {
    Single,
    ForAnyValue,
    ForAllValues,
}

#[derive(Debug, Clone, PartialEq)]
struct Condition {
    op: Op,
    set: SetOp,
    if_exists: bool,
    key: String,
    values: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
struct Statement {
    allow: bool,
    principals: Principals,
    not_principal: bool,
    actions: Vec<String>,
    not_action: bool,
    resources: Vec<String>,
    not_resource: bool,
    conditions: Vec<Condition>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    statements: Vec<Statement>,
}

/// A string or a list of strings (how IAM lets most fields be written).
fn strings(v: &Value, what: &str) -> Result<Vec<String>, PolicyError> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|i| i.as_str().map(str::to_string).ok_or_else(|| bad(format!("{what} must be a string or a list of strings"))))
            .collect(),
        _ => Err(bad(format!("{what} must be a string or a non-empty list of strings"))),
    }
}

/// A condition value: strings, numbers and booleans are all compared as their text.
fn condition_values(v: &Value, key: &str) -> Result<Vec<String>, PolicyError> {
    let one = |v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(bad(format!("condition key {key} has a value that is not a string, number or boolean"))),
    };
    match v {
        Value::Array(items) if !items.is_empty() => items.iter().map(one).collect(),
        Value::Array(_) => Err(bad(format!("condition key {key} has no values"))),
        other => Ok(vec![one(other)?]),
    }
}

fn parse_principal(v: &Value) -> Result<Principals, PolicyError> {
    match v {
        Value::String(s) if s == "*" => Ok(Principals::Everyone),
        Value::Object(m) if !m.is_empty() => {
            let mut ids = Vec::new();
            for (kind, who) in m {
                let list = strings(who, "Principal")?;
                match kind.as_str() {
                    "AWS" => {
                        if list.iter().any(|s| s == "*") {
                            return Ok(Principals::Everyone);
                        }
                        ids.extend(list);
                    }
                    "CanonicalUser" => ids.extend(list),
                    "Service" | "Federated" => {}
                    other => return Err(bad(format!("unknown principal type {other}"))),
                }
            }
            Ok(Principals::Ids(ids))
        }
        _ => Err(bad("Principal must be \"*\" or an object such as {\"AWS\": [...]}")),
    }
}

fn parse_conditions(v: &Value) -> Result<Vec<Condition>, PolicyError> {
    let Value::Object(ops) = v else { return Err(bad("Condition must be an object")) };
    let mut out = Vec::new();
    for (name, block) in ops {
        let (set, rest) = if let Some(r) = name.strip_prefix("ForAnyValue:") {
            (SetOp::ForAnyValue, r)
        } else if let Some(r) = name.strip_prefix("ForAllValues:") {
            (SetOp::ForAllValues, r)
        } else {
            (SetOp::Single, name.as_str())
        };
        let (if_exists, base) = match rest.strip_suffix("IfExists") {
            Some(b) => (true, b),
            None => (false, rest),
        };
        let op = Op::parse(base).ok_or_else(|| bad(format!("invalid condition operator {name}")))?;
        if op == Op::Null && (if_exists || set != SetOp::Single) {
            return Err(bad(format!("invalid condition operator {name}")));
        }
        let Value::Object(keys) = block else { return Err(bad(format!("condition {name} must map keys to values"))) };
        if keys.is_empty() {
            return Err(bad(format!("condition {name} names no key")));
        }
        for (key, values) in keys {
            let values = condition_values(values, key)?;
            let ok = match op {
                Op::NumericEquals | Op::NumericNotEquals | Op::NumericLessThan | Op::NumericLessThanEquals | Op::NumericGreaterThan | Op::NumericGreaterThanEquals => {
                    values.iter().all(|v| v.parse::<f64>().is_ok())
                }
                Op::DateEquals | Op::DateNotEquals | Op::DateLessThan | Op::DateLessThanEquals | Op::DateGreaterThan | Op::DateGreaterThanEquals => {
                    values.iter().all(|v| parse_date(v).is_some())
                }
                Op::Bool | Op::Null => values.iter().all(|v| v == "true" || v == "false"),
                Op::IpAddress | Op::NotIpAddress => values.iter().all(|v| parse_cidr(v).is_some()),
                _ => true,
            };
            if !ok {
                return Err(bad(format!("condition {name} on {key} has a value the operator cannot use")));
            }
            out.push(Condition { op, set, if_exists, key: canonical_key(key), values });
        }
    }
    Ok(out)
}

fn parse_statement(v: &Value) -> Result<Statement, PolicyError> {
    let Value::Object(m) = v else { return Err(bad("each Statement must be an object")) };
    for k in m.keys() {
        if !matches!(k.as_str(), "Sid" | "Effect" | "Principal" | "NotPrincipal" | "Action" | "NotAction" | "Resource" | "NotResource" | "Condition") {
            return Err(bad(format!("unknown statement field {k}")));
        }
    }
    if m.get("Sid").is_some_and(|s| !s.is_string()) {
        return Err(bad("Sid must be a string"));
    }
    let allow = match m.get("Effect").and_then(Value::as_str) {
        Some("Allow") => true,
        Some("Deny") => false,
        Some(other) => return Err(bad(format!("invalid Effect {other}: use Allow or Deny"))),
        None => return Err(bad("a statement has no Effect")),
    };
    let one_of = |a: &str, b: &str| -> Result<(&Value, bool), PolicyError> {
        match (m.get(a), m.get(b)) {
            (Some(v), None) => Ok((v, false)),
            (None, Some(v)) => Ok((v, true)),
            (Some(_), Some(_)) => Err(bad(format!("a statement has both {a} and {b}"))),
            (None, None) => Err(bad(format!("a statement has neither {a} nor {b}"))),
        }
    };
    let (p, not_principal) = one_of("Principal", "NotPrincipal")?;
    let principals = parse_principal(p)?;
    let (a, not_action) = one_of("Action", "NotAction")?;
    let actions = strings(a, "Action")?;
    for a in &actions {
        if a != "*" && !a.to_ascii_lowercase().starts_with("s3:") {
            return Err(bad(format!("action {a} is not an S3 action (s3:...)")));
        }
    }
    let (r, not_resource) = one_of("Resource", "NotResource")?;
    let resources = strings(r, "Resource")?;
    for r in &resources {
        if r != "*" && !r.starts_with("arn:aws:s3:::") {
            return Err(bad(format!("resource {r} is not an S3 resource (arn:aws:s3:::...)")));
        }
    }
    let conditions = match m.get("Condition") {
        Some(c) => parse_conditions(c)?,
        None => Vec::new(),
    };
    Ok(Statement { allow, principals, not_principal, actions, not_action, resources, not_resource, conditions })
}

impl Policy {
    /// Parses and checks a policy document; any error refuses the whole document.
    pub fn parse(doc: &[u8]) -> Result<Policy, PolicyError> {
        if doc.len() > POLICY_BYTES_MAX {
            return Err(bad(format!("policies must be at most {POLICY_BYTES_MAX} bytes")));
        }
        let v: Value = serde_json::from_slice(doc).map_err(|e| bad(format!("policy is not valid JSON: {e}")))?;
        let Value::Object(m) = &v else { return Err(bad("policy must be a JSON object")) };
        for k in m.keys() {
            if !matches!(k.as_str(), "Version" | "Id" | "Statement") {
                return Err(bad(format!("unknown policy field {k}")));
            }
        }
        match m.get("Version") {
            None => {}
            Some(Value::String(s)) if s == "2012-10-17" || s == "2008-10-17" => {}
            Some(other) => return Err(bad(format!("invalid Version {other}: use 2012-10-17"))),
        }
        let statements = match m.get("Statement") {
            Some(Value::Array(items)) if !items.is_empty() => items.iter().map(parse_statement).collect::<Result<Vec<_>, _>>()?,
            Some(s @ Value::Object(_)) => vec![parse_statement(s)?],
            _ => return Err(bad("policy must have a Statement (an object or a non-empty list)")),
        };
        if statements.len() > STATEMENTS_MAX {
            return Err(bad(format!("at most {STATEMENTS_MAX} statements")));
        }
        Ok(Policy { statements })
    }

    /// Whether any condition uses a key with this prefix (canonical form): the caller then
    /// loads what the key needs, e.g. the object's tags for `s3:existingobjecttag/`.
    pub fn uses_key_prefix(&self, prefix: &str) -> bool {
        self.statements.iter().flat_map(|s| &s.conditions).any(|c| c.key.starts_with(prefix))
    }

    /// What the policy says about `principal` (None: anonymous) doing `action` on
    /// `resource` (an ARN) in `cx`.
    pub fn evaluate(&self, principal: Option<&Principal>, action: &str, resource: &str, cx: &Context) -> Decision {
        let mut allowed = false;
        for s in &self.statements {
            // A Deny is decided for sure only when everything matches; uncertainty (an
            // unknown value) counts as a match for Deny and as none for Allow.
            if !s.applies(principal, action, resource) {
                continue;
            }
            let conds = s.conditions.iter().all(|c| c.holds(cx).unwrap_or(!s.allow));
            if !conds {
                continue;
            }
            if !s.allow {
                return Decision::Deny;
            }
            allowed = true;
        }
        if allowed { Decision::Allow } else { Decision::NoMatch }
    }
}

impl Statement {
    fn applies(&self, principal: Option<&Principal>, action: &str, resource: &str) -> bool {
        let who = match &self.principals {
            Principals::Everyone => true,
            Principals::Ids(ids) => principal.is_some_and(|p| ids.iter().any(|id| names(id, p))),
        };
        let what = self.actions.iter().any(|a| glob(&a.to_ascii_lowercase(), &action.to_ascii_lowercase()));
        let on = self.resources.iter().any(|r| r == "*" || glob(r, resource));
        who != self.not_principal && what != self.not_action && on != self.not_resource
    }
}

/// Whether a principal identifier names this user: the account id (uid), the user's name,
/// its access key, or an IAM ARN for either (`arn:aws:iam::<uid>:root`,
/// `arn:aws:iam::<uid>:user/<name>`, `arn:aws:iam:::user/<name>`).
fn names(id: &str, p: &Principal) -> bool {
    let uid = p.uid.to_string();
    if id == uid || id == p.user || id == p.access_key {
        return true;
    }
    let Some(rest) = id.strip_prefix("arn:aws:iam::") else { return false };
    let Some((account, resource)) = rest.split_once(':') else { return false };
    (account == uid && resource == "root") || ((account == uid || account.is_empty()) && resource.strip_prefix("user/") == Some(p.user.as_str()))
}

/// IAM wildcard match: `*` is any run of characters, `?` any one character.
pub fn glob(pattern: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    // Iterative match with backtracking to the last `*` (linear in practice, never
    // exponential).
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn parse_date(s: &str) -> Option<i64> {
    if let Ok(secs) = s.parse::<i64>() {
        return Some(secs);
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some(t.unix_timestamp())
}

fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a.parse::<IpAddr>().ok()?, l.parse::<u8>().ok()?),
        None => {
            let a = s.parse::<IpAddr>().ok()?;
            (a, if a.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((addr, len))
}

fn in_cidr(ip: IpAddr, (net, len): (IpAddr, u8)) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl Condition {
    /// Whether the condition holds; `None` when it cannot be decided (a request value the
    /// operator cannot read).
    fn holds(&self, cx: &Context) -> Option<bool> {
        let present = cx.get(&self.key);
        if self.op == Op::Null {
            // {"Null": {"key": "true"}}: the key is absent.
            let want_absent = self.values.iter().any(|v| v == "true");
            return Some(present.is_none() == want_absent);
        }
        let Some(actual) = present else {
            return Some(self.if_exists || self.op.negated() || self.set == SetOp::ForAllValues);
        };
        match self.set {
            SetOp::Single | SetOp::ForAnyValue => {
                // Positive operators: some request value matches some policy value.
                // Negated operators: no request value matches any policy value.
                let mut any = false;
                for a in actual {
                    any |= self.values_match(a)?;
                }
                Some(any != self.op.negated())
            }
            SetOp::ForAllValues => {
                let mut all = true;
                for a in actual {
                    let m = self.values_match(a)?;
                    all &= if self.op.negated() { !m } else { m };
                }
                Some(all)
            }
        }
    }

    /// Whether request value `a` matches one of the policy's values under the positive form
    /// of the operator (the negation is applied by the caller).
    fn values_match(&self, a: &str) -> Option<bool> {
        use Op::*;
        let mut any = false;
        for v in &self.values {
            let m = match self.op {
                StringEquals | StringNotEquals | ArnEquals | ArnNotEquals => a == v,
                StringEqualsIgnoreCase | StringNotEqualsIgnoreCase => a.eq_ignore_ascii_case(v),
                StringLike | StringNotLike | ArnLike | ArnNotLike => glob(v, a),
                NumericEquals | NumericNotEquals | NumericLessThan | NumericLessThanEquals | NumericGreaterThan | NumericGreaterThanEquals => {
                    let (x, y) = (a.parse::<f64>().ok()?, v.parse::<f64>().ok()?);
                    match self.op {
                        NumericEquals | NumericNotEquals => x == y,
                        NumericLessThan => x < y,
                        NumericLessThanEquals => x <= y,
                        NumericGreaterThan => x > y,
                        _ => x >= y,
                    }
                }
                DateEquals | DateNotEquals | DateLessThan | DateLessThanEquals | DateGreaterThan | DateGreaterThanEquals => {
                    let (x, y) = (parse_date(a)?, parse_date(v)?);
                    match self.op {
                        DateEquals | DateNotEquals => x == y,
                        DateLessThan => x < y,
                        DateLessThanEquals => x <= y,
                        DateGreaterThan => x > y,
                        _ => x >= y,
                    }
                }
                Bool => a.eq_ignore_ascii_case(v),
                IpAddress | NotIpAddress => in_cidr(a.parse().ok()?, parse_cidr(v)?),
                Null => unreachable!("Null is decided before values are compared"),
            };
            any |= m;
        }
        Some(any)
    }
}

/// The IAM action an S3 operation (s3s's operation name) needs. Operations without a
/// well-known action get `s3:<Operation>`, so `s3:*` still covers them.
pub fn action_of(op: &str) -> String {
    let a = match op {
        "GetObject" | "HeadObject" | "GetObjectAttributes" => "s3:GetObject",
        "PutObject" | "CopyObject" | "CreateMultipartUpload" | "UploadPart" | "UploadPartCopy" | "CompleteMultipartUpload" => "s3:PutObject",
        "AbortMultipartUpload" => "s3:AbortMultipartUpload",
        "ListParts" => "s3:ListMultipartUploadParts",
        "ListMultipartUploads" => "s3:ListBucketMultipartUploads",
        "DeleteObject" | "DeleteObjects" => "s3:DeleteObject",
        "ListObjects" | "ListObjectsV2" | "HeadBucket" => "s3:ListBucket",
        "ListObjectVersions" => "s3:ListBucketVersions",
        "GetBucketLocation" => "s3:GetBucketLocation",
        "GetObjectTagging" => "s3:GetObjectTagging",
        "PutObjectTagging" => "s3:PutObjectTagging",
        "DeleteObjectTagging" => "s3:DeleteObjectTagging",
        "GetObjectAcl" => "s3:GetObjectAcl",
        "PutObjectAcl" => "s3:PutObjectAcl",
        "GetBucketAcl" => "s3:GetBucketAcl",
        "PutBucketAcl" => "s3:PutBucketAcl",
        "GetBucketPolicy" => "s3:GetBucketPolicy",
        "PutBucketPolicy" => "s3:PutBucketPolicy",
        "DeleteBucketPolicy" => "s3:DeleteBucketPolicy",
        "GetBucketPolicyStatus" => "s3:GetBucketPolicyStatus",
        "GetBucketLifecycleConfiguration" => "s3:GetLifecycleConfiguration",
        "PutBucketLifecycleConfiguration" | "DeleteBucketLifecycle" => "s3:PutLifecycleConfiguration",
        "GetBucketCors" => "s3:GetBucketCORS",
        "PutBucketCors" | "DeleteBucketCors" => "s3:PutBucketCORS",
        "GetBucketVersioning" => "s3:GetBucketVersioning",
        "PutBucketVersioning" => "s3:PutBucketVersioning",
        "DeleteBucket" => "s3:DeleteBucket",
        other => return format!("s3:{other}"),
    };
    a.to_string()
}

/// The IAM action a request needs: [`action_of`], or for a request that names a version
/// (`versionId`) the `…Version…` action S3 asks for reading, deleting, tagging or changing
/// the ACL of one version (so `s3:GetObject` alone does not open a bucket's old versions).
pub fn action_of_request(op: &str, cx: &Context) -> String {
    if cx.get("s3:versionid").is_some() {
        let versioned = match op {
            "GetObject" | "HeadObject" | "GetObjectAttributes" => Some("s3:GetObjectVersion"),
            "DeleteObject" => Some("s3:DeleteObjectVersion"),
            "GetObjectTagging" => Some("s3:GetObjectVersionTagging"),
            "PutObjectTagging" => Some("s3:PutObjectVersionTagging"),
            "DeleteObjectTagging" => Some("s3:DeleteObjectVersionTagging"),
            "GetObjectAcl" => Some("s3:GetObjectVersionAcl"),
            "PutObjectAcl" => Some("s3:PutObjectVersionAcl"),
            _ => None,
        };
        if let Some(a) = versioned {
            return a.to_string();
        }
    }
    action_of(op)
}

/// Operations on a bucket's policy itself: its owner (and administrators) may always run
/// them, whatever the policy denies, so that a policy cannot lock its owner out.
pub fn is_policy_admin(op: &str) -> bool {
    matches!(op, "GetBucketPolicy" | "PutBucketPolicy" | "DeleteBucketPolicy")
}

pub fn bucket_arn(bucket: &str) -> String {
    format!("arn:aws:s3:::{bucket}")
}

pub fn object_arn(bucket: &str, key: &str) -> String {
    format!("arn:aws:s3:::{bucket}/{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Principal {
        Principal { uid: 1001, user: "alice".into(), access_key: "AKALICE".into() }
    }

    fn policy(statements: &str) -> Policy {
        Policy::parse(format!(r#"{{"Version":"2012-10-17","Statement":{statements}}}"#).as_bytes()).expect("valid policy")
    }

    #[test]
    fn malformed_policies_are_refused() {
        let cases: &[&str] = &[
            "not json",
            "[]",
            r#"{"Version":"2012-10-17"}"#,
            r#"{"Version":"2012-10-17","Statement":[]}"#,
            r#"{"Version":"2099-01-01","Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*"}]}"#,
            r#"{"Statement":[{"Effect":"Maybe","Principal":"*","Action":"s3:GetObject","Resource":"*"}]}"#,
            r#"{"Statement":[{"Principal":"*","Action":"s3:GetObject","Resource":"*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Resource":"*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"ec2:Run","Resource":"*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:ec2:::x"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*","Condition":{"StringSortOf":{"s3:prefix":"a"}}}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*","Condition":{"NumericEquals":{"s3:max-keys":"ten"}}}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*","Colour":"red"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","NotPrincipal":"*","Action":"s3:GetObject","Resource":"*"}]}"#,
        ];
        for c in cases {
            assert!(Policy::parse(c.as_bytes()).is_err(), "accepted {c}");
        }
        let big = format!(r#"{{"Statement":[{{"Sid":"{}","Effect":"Allow","Principal":"*","Action":"*","Resource":"*"}}]}}"#, "x".repeat(POLICY_BYTES_MAX));
        assert!(Policy::parse(big.as_bytes()).is_err());
    }

    #[test]
    fn allow_grants_only_what_matches() {
        let p = policy(r#"[{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/pub/*"}]"#);
        let cx = Context::default();
        assert_eq!(p.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/pub/x", &cx), Decision::Allow);
        assert_eq!(p.evaluate(Some(&alice()), "s3:getobject", "arn:aws:s3:::b/pub/a/b", &cx), Decision::Allow);
        // No match means no grant: another key, another action, another bucket.
        assert_eq!(p.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/priv/x", &cx), Decision::NoMatch);
        assert_eq!(p.evaluate(None, "s3:PutObject", "arn:aws:s3:::b/pub/x", &cx), Decision::NoMatch);
        assert_eq!(p.evaluate(None, "s3:GetObject", "arn:aws:s3:::c/pub/x", &cx), Decision::NoMatch);
        assert_eq!(p.evaluate(None, "s3:ListBucket", "arn:aws:s3:::b", &cx), Decision::NoMatch);
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = policy(
            r#"[{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]},
                {"Effect":"Deny","Principal":"*","Action":"s3:DeleteObject","Resource":"arn:aws:s3:::b/keep/*"}]"#,
        );
        let cx = Context::default();
        assert_eq!(p.evaluate(Some(&alice()), "s3:DeleteObject", "arn:aws:s3:::b/keep/x", &cx), Decision::Deny);
        assert_eq!(p.evaluate(Some(&alice()), "s3:DeleteObject", "arn:aws:s3:::b/other", &cx), Decision::Allow);
        assert_eq!(p.evaluate(Some(&alice()), "s3:ListBucket", "arn:aws:s3:::b", &cx), Decision::Allow);
    }

    #[test]
    fn principals_name_users_by_id_name_key_or_arn() {
        for id in ["1001", "alice", "AKALICE", "arn:aws:iam::1001:root", "arn:aws:iam::1001:user/alice", "arn:aws:iam:::user/alice"] {
            let p = policy(&format!(r#"[{{"Effect":"Allow","Principal":{{"AWS":["{id}"]}},"Action":"s3:GetObject","Resource":"*"}}]"#));
            assert_eq!(p.evaluate(Some(&alice()), "s3:GetObject", "arn:aws:s3:::b/k", &Context::default()), Decision::Allow, "{id}");
            // Anonymous clients are named only by "*".
            assert_eq!(p.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &Context::default()), Decision::NoMatch, "{id}");
        }
        let p = policy(r#"[{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam::1002:root"},"Action":"s3:GetObject","Resource":"*"}]"#);
        assert_eq!(p.evaluate(Some(&alice()), "s3:GetObject", "arn:aws:s3:::b/k", &Context::default()), Decision::NoMatch);
        let p = policy(r#"[{"Effect":"Deny","NotPrincipal":{"AWS":"alice"},"Action":"s3:GetObject","Resource":"*"}]"#);
        assert_eq!(p.evaluate(Some(&alice()), "s3:GetObject", "arn:aws:s3:::b/k", &Context::default()), Decision::NoMatch);
        assert_eq!(p.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &Context::default()), Decision::Deny);
    }

    #[test]
    fn conditions() {
        let p = policy(
            r#"[{"Effect":"Allow","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::b",
                 "Condition":{"StringLike":{"s3:prefix":"home/*"},"NumericLessThanEquals":{"s3:max-keys":"100"}}}]"#,
        );
        let mut cx = Context::default();
        assert_eq!(p.evaluate(None, "s3:ListBucket", "arn:aws:s3:::b", &cx), Decision::NoMatch, "missing key: no grant");
        cx.set("s3:prefix", "home/alice");
        cx.set("s3:max-keys", "10");
        assert_eq!(p.evaluate(None, "s3:ListBucket", "arn:aws:s3:::b", &cx), Decision::Allow);
        cx.set("s3:max-keys", "1000");
        assert_eq!(p.evaluate(None, "s3:ListBucket", "arn:aws:s3:::b", &cx), Decision::NoMatch);
        cx.set("s3:max-keys", "lots");
        assert_eq!(p.evaluate(None, "s3:ListBucket", "arn:aws:s3:::b", &cx), Decision::NoMatch, "unreadable value: no grant");

        // The same undecidable value makes a Deny hold.
        let d = policy(r#"[{"Effect":"Deny","Principal":"*","Action":"s3:ListBucket","Resource":"*","Condition":{"NumericGreaterThan":{"s3:max-keys":"100"}}}]"#);
        assert_eq!(d.evaluate(None, "s3:ListBucket", "arn:aws:s3:::b", &cx), Decision::Deny);

        // Tags, negation, IfExists and Null.
        let t = policy(r#"[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*","Condition":{"StringEquals":{"s3:ExistingObjectTag/security":"public"}}}]"#);
        let mut cx = Context::default();
        cx.set("s3:ExistingObjectTag/Security", "public");
        assert_eq!(t.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &cx), Decision::NoMatch, "tag keys are case-sensitive");
        cx.set("s3:existingobjecttag/security", "public");
        assert_eq!(t.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &cx), Decision::Allow);
        let n = policy(r#"[{"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"*","Condition":{"StringNotEquals":{"s3:x-amz-server-side-encryption":"AES256"}}}]"#);
        assert_eq!(n.evaluate(None, "s3:PutObject", "arn:aws:s3:::b/k", &Context::default()), Decision::Deny, "negated operator, missing key");
        let mut enc = Context::default();
        enc.set("s3:x-amz-server-side-encryption", "AES256");
        assert_eq!(n.evaluate(None, "s3:PutObject", "arn:aws:s3:::b/k", &enc), Decision::NoMatch);
        let r = policy(r#"[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*","Condition":{"StringLikeIfExists":{"aws:Referer":"http://www.example.com/*"}}}]"#);
        assert_eq!(r.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &Context::default()), Decision::Allow);
        let mut refd = Context::default();
        refd.set("aws:Referer", "http://www.example.com");
        assert_eq!(r.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &refd), Decision::NoMatch);
        refd.set("aws:referer", "http://www.example.com/index.html");
        assert_eq!(r.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &refd), Decision::Allow);
        let null = policy(r#"[{"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"*","Condition":{"Null":{"s3:x-amz-server-side-encryption":"true"}}}]"#);
        assert_eq!(null.evaluate(None, "s3:PutObject", "arn:aws:s3:::b/k", &Context::default()), Decision::Deny);
        assert_eq!(null.evaluate(None, "s3:PutObject", "arn:aws:s3:::b/k", &enc), Decision::NoMatch);
        let ip = policy(r#"[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*","Condition":{"IpAddress":{"aws:SourceIp":["10.0.0.0/8","::1"]}}}]"#);
        let mut from = Context::default();
        from.set("aws:SourceIp", "10.1.2.3");
        assert_eq!(ip.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &from), Decision::Allow);
        from.set("aws:SourceIp", "192.168.0.1");
        assert_eq!(ip.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &from), Decision::NoMatch);
        from.set("aws:SourceIp", "::1");
        assert_eq!(ip.evaluate(None, "s3:GetObject", "arn:aws:s3:::b/k", &from), Decision::Allow);
    }

    /// Policies come from the network: mutated and truncated documents must parse or be
    /// refused, never panic, and whatever parses must evaluate without panicking.
    #[test]
    fn mutated_policies_never_panic() {
        let seeds: &[&str] = &[
            r#"{"Version":"2012-10-17","Statement":[{"Sid":"a","Effect":"Allow","Principal":{"AWS":["*","arn:aws:iam::1:user/alice"]},"Action":["s3:Get*","s3:ListBucket"],"Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"],"Condition":{"StringLike":{"s3:prefix":["a/*","b?"]},"NumericLessThanEquals":{"s3:max-keys":"10"}}}]}"#,
            r#"{"Statement":{"Effect":"Deny","NotPrincipal":"*","NotAction":"s3:*","NotResource":"*","Condition":{"IpAddress":{"aws:SourceIp":"10.0.0.0/8"},"DateGreaterThanIfExists":{"aws:CurrentTime":"2020-01-01T00:00:00Z"},"ForAnyValue:StringEquals":{"s3:ExistingObjectTag/k":["v"]},"Null":{"s3:x-amz-acl":"true"},"Bool":{"aws:SecureTransport":"false"},"ArnLike":{"aws:SourceArn":"arn:*"}}}}"#,
        ];
        let tokens: &[&[u8]] = &[b"{", b"}", b"[", b"]", b"\"", b":", b",", b"*", b"null", b"1e999", b"-", b"\\u0000", b"\xff"];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut cx = Context::default();
        cx.set("s3:prefix", "a/b");
        cx.set("s3:max-keys", "5");
        cx.set("aws:SourceIp", "10.1.2.3");
        let mut parsed = 0;
        for round in 0..20_000u64 {
            let mut doc = seeds[(round % seeds.len() as u64) as usize].as_bytes().to_vec();
            for _ in 0..1 + next() % 4 {
                let at = (next() % (doc.len() as u64 + 1)) as usize;
                match next() % 4 {
                    0 => doc.truncate(at),
                    1 if at < doc.len() => doc[at] = next() as u8,
                    2 => {
                        let t = tokens[(next() % tokens.len() as u64) as usize];
                        doc.splice(at..at, t.iter().copied());
                    }
                    _ if at < doc.len() => {
                        doc.remove(at);
                    }
                    _ => {}
                }
            }
            if let Ok(p) = Policy::parse(&doc) {
                parsed += 1;
                for action in ["s3:GetObject", "s3:ListBucket", "s3:PutObject"] {
                    let _ = p.evaluate(Some(&alice()), action, "arn:aws:s3:::b/a/x", &cx);
                    let _ = p.evaluate(None, action, "arn:aws:s3:::b", &cx);
                }
            }
        }
        assert!(parsed > 0, "some mutations still parse, so evaluation was exercised");
    }

    #[test]
    fn wildcards() {
        assert!(glob("arn:aws:s3:::b/*", "arn:aws:s3:::b/a/b/c"));
        assert!(glob("arn:aws:s3:::b/?.txt", "arn:aws:s3:::b/a.txt"));
        assert!(!glob("arn:aws:s3:::b/?.txt", "arn:aws:s3:::b/ab.txt"));
        assert!(glob("s3:get*", "s3:getobject"));
        assert!(glob("*a*b*", "xxaxxbxx"));
        assert!(!glob("*a*b", "xxaxxbxxc"));
        assert!(glob("", ""));
        assert!(!glob("arn:aws:s3:::b", "arn:aws:s3:::b/x"));
    }
}
