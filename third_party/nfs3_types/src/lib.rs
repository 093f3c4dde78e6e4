#![doc = include_str!("../README.md")]

extern crate self as nfs3_types;

pub mod mount;
pub mod nfs3;
pub mod portmap;
pub mod rpc;
pub mod xdr_codec;
