//! Portals: a hub directory extended to a spoke cluster across a WAN.
pub mod wan;
