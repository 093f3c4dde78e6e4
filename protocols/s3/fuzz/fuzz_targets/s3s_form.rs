//! How s3s 0.14.1 reads the start of a POST form (its `src/http/multipart.rs`, `try_parse`,
//! `CrlfLines` and `parse_content_disposition`, followed step by step without its streams):
//! the fuzz target checks that s3s reads the form written back for it as the fields that
//! were checked. Kept to s3s's reading, quirks included; s3s is pinned at 0.14.1.

/// What s3s makes of a form's start.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// It waits for more of the body (at the end of the body: `InvalidFormat`).
    More,
    /// `InvalidFormat` and the other refusals.
    Refused,
    /// The fields (names in lower case, sorted by name, stably) and where the file starts.
    Form { fields: Vec<(String, String)>, data_start: usize },
}

/// CRLF lines: the bytes to the next `\r\n`, or the rest where there is none.
struct Lines<'a> {
    slice: &'a [u8],
}

impl<'a> Lines<'a> {
    fn next_line(&mut self) -> Option<&'a [u8]> {
        for idx in memchr::memchr_iter(b'\n', self.slice) {
            if idx == 0 {
                continue;
            }
            if self.slice[idx - 1] == b'\r' {
                let left = &self.slice[..idx - 1];
                self.slice = &self.slice[idx + 1..];
                return Some(left);
            }
        }
        if self.slice.is_empty() { None } else { Some(std::mem::take(&mut self.slice)) }
    }

    /// The bytes up to a line equal to `pat` (with the CRLF before it), and past that line.
    fn split_to(&mut self, pat: &[u8]) -> Option<&'a [u8]> {
        let mut len: usize = 0;
        let mut lines = Lines { slice: self.slice };
        loop {
            let line = lines.next_line()?;
            if line == pat {
                len = len.min(self.slice.len());
                let ans = &self.slice[..len];
                self.slice = lines.slice;
                return Some(ans);
            }
            len = len.wrapping_add(line.len()).saturating_add(2);
        }
    }
}

/// `form-data; name="N"` with an optional `; filename="F"`, nothing else, N and F at least
/// one byte without a quote.
fn content_disposition(v: &[u8]) -> Option<(&str, Option<&str>)> {
    fn quoted<'a>(v: &'a [u8], tag: &[u8]) -> Option<(&'a str, &'a [u8])> {
        let v = v.strip_prefix(tag)?;
        let end = v.iter().position(|&b| b == b'"').filter(|&e| e > 0)?;
        Some((std::str::from_utf8(&v[..end]).ok()?, &v[end + 1..]))
    }
    let v = v.strip_prefix(b"form-data; ")?;
    let (name, rest) = quoted(v, b"name=\"")?;
    if rest.is_empty() {
        return Some((name, None));
    }
    let (file, rest) = quoted(rest.strip_prefix(b"; ")?, b"filename=\"")?;
    rest.is_empty().then_some((name, Some(file)))
}

pub fn read(buf: &[u8], boundary: &str) -> Read {
    let pat = format!("--{boundary}");
    let pat = pat.as_bytes();
    let mut lines = Lines { slice: buf };
    match lines.next_line() {
        None => return Read::More,
        Some([]) => match lines.next_line() {
            None => return Read::More,
            Some(line) if line != pat => return Read::Refused,
            Some(_) => {}
        },
        Some(line) if line != pat => return Read::Refused,
        Some(_) => {}
    }
    let mut fields = Vec::new();
    let (mut total, mut parts) = (0usize, 0usize);
    loop {
        parts += 1;
        if parts > 1000 {
            return Read::Refused;
        }
        let mut headers = [httparse::EMPTY_HEADER; 2];
        let (idx, parsed) = match httparse::parse_headers(lines.slice, &mut headers) {
            Ok(httparse::Status::Complete(ans)) => ans,
            Ok(_) => return Read::More,
            Err(_) => return Read::Refused,
        };
        let (mut cd, mut ct) = (None, None);
        for h in parsed {
            if h.name.eq_ignore_ascii_case("Content-Disposition") {
                cd = Some(h.value);
            } else if h.name.eq_ignore_ascii_case("Content-Type") {
                ct = Some(h.value);
            }
        }
        lines.slice = &lines.slice[idx..];
        let Some(cd) = cd else { return Read::More };
        let Some((name, _file_name)) = content_disposition(cd) else { return Read::Refused };
        if name.eq_ignore_ascii_case("file") {
            if ct.is_some_and(|t| std::str::from_utf8(t).is_err()) {
                return Read::Refused;
            }
            for f in &mut fields {
                let (n, _): &mut (String, String) = f;
                n.make_ascii_lowercase();
            }
            fields.sort_by(|a: &(String, String), b| a.0.cmp(&b.0));
            return Read::Form { fields, data_start: buf.len() - lines.slice.len() };
        }
        let Some(b) = lines.split_to(pat) else { return Read::More };
        let b = &b[..b.len().saturating_sub(2)];
        total = total.saturating_add(b.len());
        if b.len() > 1024 * 1024 || total > 20 * 1024 * 1024 {
            return Read::Refused;
        }
        let Ok(value) = std::str::from_utf8(b) else { return Read::Refused };
        fields.push((name.to_string(), value.to_string()));
    }
}
