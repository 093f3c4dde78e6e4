//! Reading a browser upload's `multipart/form-data` body (POST Object) up to its file part,
//! and writing the fields back in front of the file for s3s.
//!
//! Anyone can send this body: it is read before s3s verifies the form's signature. It has no
//! s3s types, so that the fuzz target (`protocols/s3/fuzz`, `post_form`) compiles it unchanged;
//! `post.rs` turns a [`FormError`] into S3's error.

/// The form fields before the file part (all of them, with their part headers) may take at
/// most this many bytes; more is `400 MaxPostPreDataLengthExceededError`, as in S3.
pub const FORM_FIELDS_BYTES_MAX: usize = 1 << 20;

/// A form has at most this many parts, the file's included; a form with more is refused as
/// soon as a part past the limit begins (`400 MalformedPOSTRequest`), as s3s refuses it
/// (its `form_max_parts`, set to this).
pub const FORM_PARTS_MAX: usize = 1000;

/// Why a body is not a form S3 takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FormError {
    /// Not well-formed `multipart/form-data`; says what is wrong.
    Malformed(&'static str),
    /// The closing boundary came before a part named `file`.
    NoFile,
    /// More than [`FORM_PARTS_MAX`] parts.
    TooManyParts,
    /// The field (with the file's name put into `key`) holds the form's boundary line.
    BoundaryInValue(String),
}

impl std::fmt::Display for FormError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormError::Malformed(what) => write!(f, "the body of the POST request is not well-formed multipart/form-data: {what}"),
            FormError::NoFile => f.write_str("POST requires exactly one file upload per request"),
            FormError::TooManyParts => write!(f, "the form has more than {FORM_PARTS_MAX} parts"),
            FormError::BoundaryInValue(name) => write!(f, "the form field '{name}', with the file's name put in, holds the form's boundary"),
        }
    }
}

/// A form read up to its file part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Form {
    /// Names as sent, values.
    pub fields: Vec<(String, String)>,
    /// The file part's `filename`, where it has one.
    pub file_name: Option<String>,
    /// The file part's header lines, blank line included.
    pub file_headers: std::ops::Range<usize>,
    /// Where the file's content starts in the buffer.
    pub data_start: usize,
}

/// The `boundary` parameter of a `Content-Type` header (quotes taken off): 1 to 70
/// characters, as RFC 2046 allows, without line breaks.
pub(crate) fn boundary_of(content_type: &str) -> Option<String> {
    for param in content_type.split(';').skip(1) {
        if let Some((k, v)) = param.split_once('=')
            && k.trim().eq_ignore_ascii_case("boundary")
        {
            let v = v.trim().trim_matches('"');
            if !v.is_empty() && v.len() <= 70 && !v.contains(['\r', '\n']) {
                return Some(v.to_string());
            }
        }
    }
    None
}

/// When the reader looks through the form from the start again for its file part: once
/// the bytes read have doubled since its last look, when the body has ended, and when more
/// than [`FORM_FIELDS_BYTES_MAX`] have been read. Looking at every frame instead made the work
/// quadratic in the form's size: a client that splits its body into 1-byte chunks had the
/// listener scan the whole buffer a million times for one request (about half an hour of a
/// core for a 1 MiB form, before anyone is authenticated). With doubling, all looks together
/// read at most twice the bytes of the last one.
#[derive(Default)]
pub(crate) struct Looks {
    /// Bytes read at the last look.
    at: usize,
}

impl Looks {
    pub(crate) fn due(&mut self, read: usize, ended: bool) -> bool {
        let due = ended || read > FORM_FIELDS_BYTES_MAX || (read > self.at && read >= 2 * self.at);
        if due {
            self.at = read;
        }
        due
    }
}

/// `needle` in `hay` at or after `from`, in time linear in the bytes searched (a boundary
/// is up to 74 bytes; comparing it at every position could cost 74 times the form).
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    memchr::memmem::find(hay.get(from..)?, needle).map(|i| i + from)
}

/// Reads `buf`, a form's body from its start, up to the file part: `Ok(None)` while the
/// buffer ends before the file part's headers do. An answer other than `Ok(None)` stays the
/// same however many bytes follow.
pub(crate) fn parse_form(buf: &[u8], boundary: &str) -> Result<Option<Form>, FormError> {
    let delim = format!("--{boundary}");
    let delim = delim.as_bytes();
    // A preamble before the first boundary is allowed and ignored.
    let Some(first) = find(buf, delim, 0) else { return Ok(None) };
    if first > 0 && !buf[..first].ends_with(b"\r\n") {
        return Err(FormError::Malformed("text before the first boundary"));
    }
    let mut end_pat = b"\r\n".to_vec();
    end_pat.extend_from_slice(delim);
    let mut pos = first + delim.len();
    let mut fields = Vec::new();
    loop {
        match buf.get(pos..pos + 2) {
            None => return Ok(None),
            Some(b"\r\n") => pos += 2,
            Some(b"--") => return Err(FormError::NoFile),
            Some(_) => return Err(FormError::Malformed("a boundary line with more after it")),
        }
        if fields.len() >= FORM_PARTS_MAX {
            return Err(FormError::TooManyParts);
        }
        // From the boundary line's CRLF: a blank line right after it ends an empty header
        // section (the part's content starts there), as s3s reads it.
        let Some(headers_end) = find(buf, b"\r\n\r\n", pos - 2) else { return Ok(None) };
        let (name, file_name) = disposition(&buf[pos..headers_end + 2])?;
        let data_start = headers_end + 4;
        if name.eq_ignore_ascii_case("file") {
            return Ok(Some(Form { fields, file_name, file_headers: pos..data_start, data_start }));
        }
        let Some(end) = find(buf, &end_pat, data_start) else { return Ok(None) };
        let value = std::str::from_utf8(&buf[data_start..end]).map_err(|_| FormError::Malformed("a field value that is not UTF-8"))?;
        fields.push((name, value.to_string()));
        pos = end + end_pat.len();
    }
}

/// The `name` and `filename` of a part's `Content-Disposition: form-data` header. Header
/// lines end with CRLF only, and a part has one `Content-Disposition`: s3s, which reads the
/// form again after the checks, ends lines at a bare LF too and takes the last of two
/// headers, so a part that reads two ways is refused.
fn disposition(headers: &[u8]) -> Result<(String, Option<String>), FormError> {
    let text = std::str::from_utf8(headers).map_err(|_| FormError::Malformed("part headers that are not UTF-8"))?;
    let mut found = None;
    for line in text.split("\r\n") {
        if line.contains(['\r', '\n']) {
            return Err(FormError::Malformed("a part header line with a bare CR or LF"));
        }
        let Some((h, v)) = line.split_once(':') else { continue };
        if !h.trim().eq_ignore_ascii_case("content-disposition") {
            continue;
        }
        if found.is_some() {
            return Err(FormError::Malformed("a part with two Content-Disposition headers"));
        }
        let (mut name, mut file_name) = (None, None);
        let mut params = split_params(v);
        if !params.next().is_some_and(|p| p.trim().eq_ignore_ascii_case("form-data")) {
            return Err(FormError::Malformed("a part that is not form-data"));
        }
        for p in params {
            let Some((k, val)) = p.split_once('=') else { continue };
            let val = val.trim();
            let val = val.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(val).to_string();
            match k.trim().to_ascii_lowercase().as_str() {
                "name" => name = Some(val),
                "filename" => file_name = Some(val),
                _ => {}
            }
        }
        let name = name.ok_or(FormError::Malformed("a part without a name"))?;
        if name.is_empty() || name.contains(['"', '\r', '\n']) {
            return Err(FormError::Malformed("a part name that is empty or holds a quote"));
        }
        found = Some((name, file_name));
    }
    found.ok_or(FormError::Malformed("a part without Content-Disposition"))
}

/// Splits header parameters at `;` outside quoted strings.
fn split_params(v: &str) -> impl Iterator<Item = &str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in v.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ';' if !quoted => {
                out.push(&v[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&v[start..]);
    out.into_iter()
}

/// The fields as S3 checks them and s3s is to read them: names in lower case, and
/// `${filename}` in `key` replaced by the file part's name (empty where it has none).
pub(crate) fn checked_fields(form: &Form) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = form.fields.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.clone())).collect();
    if let Some(key) = fields.iter_mut().find(|(n, _)| n == "key")
        && key.1.contains("${filename}")
    {
        key.1 = key.1.replace("${filename}", form.file_name.as_deref().unwrap_or(""));
    }
    fields
}

/// The form's start again as s3s is to read it: each field (`names` as [`parse_form`] read
/// them, with the values given), then the file part's headers as sent; the file's bytes
/// follow it. A value that holds the boundary line (a `key` can, once the file's name is put
/// in) or starts with the boundary would read back as more fields than were checked, and is
/// refused.
pub(crate) fn rebuild<'a>(boundary: &str, fields: impl Iterator<Item = (&'a str, &'a str)>, file_headers: &[u8]) -> Result<Vec<u8>, FormError> {
    let delim = format!("\r\n--{boundary}");
    let mut out = Vec::with_capacity(file_headers.len() + 256);
    for (name, value) in fields {
        // At the value's start, the CRLF that ends the part's headers comes before it.
        if value.as_bytes().starts_with(&delim.as_bytes()[2..]) || memchr::memmem::find(value.as_bytes(), delim.as_bytes()).is_some() {
            return Err(FormError::BoundaryInValue(name.to_string()));
        }
        out.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes());
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
    out.extend_from_slice(file_headers);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However finely the form arrives, the looks at it read a linear number of bytes in
    /// all, the last look sees every byte, and the end of the body is always looked at.
    #[test]
    fn the_form_is_looked_at_a_logarithmic_number_of_times() {
        let mut looks = Looks::default();
        let (mut count, mut scanned, mut last) = (0usize, 0usize, 0usize);
        for read in 0..=FORM_FIELDS_BYTES_MAX + 1 {
            if looks.due(read, false) {
                count += 1;
                scanned += read;
                last = read;
            }
        }
        assert_eq!(last, FORM_FIELDS_BYTES_MAX + 1, "a form past the limit is looked at, so it is refused");
        assert!(count <= 22, "{count} looks for 1 MiB read a byte at a time");
        assert!(scanned <= 2 * (FORM_FIELDS_BYTES_MAX + 1) + FORM_FIELDS_BYTES_MAX, "{scanned} bytes scanned");
        let mut looks = Looks::default();
        assert!(looks.due(1000, false));
        assert!(!looks.due(1500, false));
        assert!(looks.due(1500, true), "the end of the body is looked at");
        assert!(!Looks::default().due(0, false), "nothing read: nothing to look at");
    }

    #[test]
    fn form_is_read_up_to_the_file_and_rebuilt() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\na/${filename}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f; x.txt\"\r\nContent-Type: text/plain\r\n\r\nhello";
        for cut in 0..body.len() - 5 {
            assert_eq!(parse_form(&body[..cut], "XyZ"), Ok(None), "cut at {cut}");
        }
        let f = parse_form(body, "XyZ").unwrap().unwrap();
        assert_eq!(f.fields, vec![("key".to_string(), "a/${filename}".to_string())]);
        assert_eq!(f.file_name.as_deref(), Some("f; x.txt"));
        assert_eq!(&body[f.data_start..], b"hello");
        let mut again = rebuild("XyZ", [("key", "a/b")].into_iter(), &body[f.file_headers.clone()]).unwrap();
        let start = again.len();
        again.extend_from_slice(b"hello");
        let g = parse_form(&again, "XyZ").unwrap().unwrap();
        assert_eq!((g.fields, g.file_name, g.data_start), (vec![("key".to_string(), "a/b".to_string())], f.file_name, start));
    }

    /// A value that begins with the boundary line or holds it would read back as more parts.
    #[test]
    fn values_holding_the_boundary_are_not_written_back() {
        let headers = b"Content-Disposition: form-data; name=\"file\"\r\n\r\n";
        for bad in ["--XyZ", "--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nb", "a\r\n--XyZ", "a\r\n--XyZ--"] {
            assert_eq!(rebuild("XyZ", [("x", "ok"), ("key", bad)].into_iter(), headers), Err(FormError::BoundaryInValue("key".to_string())), "{bad:?}");
        }
        // The file's name put into `key` can make one.
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"Key\"\r\n\r\na\r\n${filename}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"--XyZ\"\r\n\r\nx";
        let f = parse_form(body, "XyZ").unwrap().unwrap();
        let checked = checked_fields(&f);
        assert_eq!(checked, vec![("key".to_string(), "a\r\n--XyZ".to_string())]);
        let names = f.fields.iter().map(|(n, _)| n.as_str());
        assert_eq!(rebuild("XyZ", names.zip(checked.iter().map(|(_, v)| v.as_str())), &body[f.file_headers.clone()]), Err(FormError::BoundaryInValue("Key".to_string())));
        for fine in ["", "-", "--XyY", "a--XyZ", "a\n--XyZ", "a\r\n-XyZ"] {
            assert!(rebuild("XyZ", [("key", fine)].into_iter(), headers).is_ok(), "{fine:?}");
        }
    }

    #[test]
    fn forms_s3_cannot_read_are_refused() {
        let part = |name: &str| format!("--B\r\nContent-Disposition: form-data; name={name}\r\n\r\nv\r\n");
        let cases: &[(String, FormError)] = &[
            (format!("{}--B--\r\n", part("a")), FormError::NoFile),
            ("junk--B\r\n".to_string(), FormError::Malformed("text before the first boundary")),
            ("--Bx\r\n".to_string(), FormError::Malformed("a boundary line with more after it")),
            (format!("{}--B\r\n", part("\"\"")), FormError::Malformed("a part name that is empty or holds a quote")),
            ("--B\r\nContent-Type: text/plain\r\n\r\n".to_string(), FormError::Malformed("a part without Content-Disposition")),
            ("--B\r\nContent-Disposition: attachment; name=a\r\n\r\n".to_string(), FormError::Malformed("a part that is not form-data")),
            ("--B\r\nContent-Disposition: form-data\r\n\r\n".to_string(), FormError::Malformed("a part without a name")),
        ];
        for (body, want) in cases {
            assert_eq!(parse_form(body.as_bytes(), "B").as_ref(), Err(want), "{body:?}");
        }
        // Forms s3s would read another way.
        let file = "Content-Disposition: form-data; name=\"file\"";
        let two_ways: &[(String, &str)] = &[
            (format!("--B\r\n{file}\n\r\nX: 1\r\n\r\nx"), "a part header line with a bare CR or LF"),
            (format!("--B\r\nX: 1\r{file}\r\n\r\nx"), "a part header line with a bare CR or LF"),
            (format!("--B\r\n{file}\r\nContent-Disposition: form-data; name=\"acl\"\r\n\r\nx"), "a part with two Content-Disposition headers"),
            (format!("--B\r\n\r\nv\r\n--B\r\n{file}\r\n\r\nx"), "a part without Content-Disposition"),
        ];
        for (body, want) in two_ways {
            assert_eq!(parse_form(body.as_bytes(), "B"), Err(FormError::Malformed(want)), "{body:?}");
        }
        let many: String = (0..FORM_PARTS_MAX).map(|i| part(&format!("f{i}"))).collect();
        assert_eq!(parse_form(format!("{many}--B\r\n").as_bytes(), "B"), Err(FormError::TooManyParts));
        let fewer: String = (1..FORM_PARTS_MAX).map(|i| part(&format!("f{i}"))).collect();
        let f = parse_form(format!("{fewer}--B\r\nContent-Disposition: form-data; name=file\r\n\r\nx").as_bytes(), "B").unwrap().unwrap();
        assert_eq!(f.fields.len(), FORM_PARTS_MAX - 1);
        let not_utf8 = [b"--B\r\nContent-Disposition: form-data; name=a\r\n\r\n\xff\r\n--B\r\n".as_slice()].concat();
        assert_eq!(parse_form(&not_utf8, "B"), Err(FormError::Malformed("a field value that is not UTF-8")));
        assert_eq!(boundary_of("multipart/form-data; boundary=\"a b\""), Some("a b".to_string()));
        assert_eq!(boundary_of("multipart/form-data; BOUNDARY=x; charset=utf-8"), Some("x".to_string()));
        for ct in ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=\"\""] {
            assert_eq!(boundary_of(ct), None, "{ct}");
        }
        assert_eq!(boundary_of(&format!("multipart/form-data; boundary={}", "b".repeat(71))), None);
    }
}
