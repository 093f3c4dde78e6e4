//! Nothing to build: the tests are in tests/smb_rs.rs.
