//! Fuzzes the reading of browser uploads' forms (protocols/s3/src/form.rs, compiled here
//! unchanged): anyone can send a POST form, and it is read before its signature is checked.
//!
//!     RUSTC_BOOTSTRAP=1 cargo fuzz run post_form -- -max_total_time=240
//!
//! Input: the boundary, then after a NUL byte the body. Checks that an answer other than
//! "not yet" does not change as more of the body arrives, that a form read has the shape
//! the listener relies on, and that the form written back for s3s (fields as checked, with
//! the file's name put into `key`) reads back as the same fields and the same file, both
//! here and as s3s reads it (`s3s_form.rs`): what s3s acts on must be what was checked.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/form.rs"]
#[allow(dead_code)]
mod form;

mod s3s_form;

fuzz_target!(|data: &[u8]| {
    let Some(nul) = data.iter().position(|&b| b == 0) else { return };
    let Ok(param) = std::str::from_utf8(&data[..nul]) else { return };
    let Some(boundary) = form::boundary_of(&format!("multipart/form-data; boundary={param}")) else { return };
    let body = &data[nul + 1..];
    let whole = form::parse_form(body, &boundary);

    // The reader looks at a growing buffer: whatever it answers before the end must be what
    // it answers at the end.
    let step = (body.len() / 16).max(1);
    for cut in (0..body.len()).step_by(step).chain(body.len().saturating_sub(4)..body.len()) {
        match form::parse_form(&body[..cut], &boundary) {
            Ok(None) => {}
            early => assert_eq!(early, whole, "the answer at byte {cut} of {} changed", body.len()),
        }
    }

    let Ok(Some(f)) = whole else { return };
    assert!(f.file_headers.end == f.data_start && f.data_start <= body.len());
    assert!(body[..f.data_start].ends_with(b"\r\n\r\n"));
    for (name, _) in &f.fields {
        assert!(!name.is_empty() && !name.contains(['"', '\r', '\n']) && !name.eq_ignore_ascii_case("file"), "{name:?}");
    }

    // What s3s is handed: the fields as checked, then the file part as sent.
    let checked = form::checked_fields(&f);
    let names = f.fields.iter().map(|(n, _)| n.as_str());
    let Ok(mut again) = form::rebuild(&boundary, names.zip(checked.iter().map(|(_, v)| v.as_str())), &body[f.file_headers.clone()]) else { return };
    let start = again.len();
    again.extend_from_slice(&body[f.data_start..]);
    let g = form::parse_form(&again, &boundary).expect("the form written back reads").expect("the form written back is whole");
    let values: Vec<&str> = g.fields.iter().map(|(_, v)| v.as_str()).collect();
    let want: Vec<&str> = checked.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(values, want, "the form written back has other fields than were checked");
    assert_eq!((g.file_name, g.data_start), (f.file_name, start));

    // s3s reads the same bytes as the same fields (it sorts them by name) and file, or
    // refuses the form; it must not read on into the file for more fields.
    let mut sorted = checked.clone();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    match s3s_form::read(&again, &boundary) {
        s3s_form::Read::Refused => {}
        s3s_form::Read::Form { fields, data_start } => {
            assert_eq!(fields, sorted, "s3s reads other fields than were checked");
            assert_eq!(data_start, start, "s3s's file starts elsewhere");
        }
        s3s_form::Read::More => panic!("s3s reads on past the file part's headers"),
    }
});
