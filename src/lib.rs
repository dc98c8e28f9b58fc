//! leasefs: a FUSE filesystem that turns a mounted directory into a lock
//! service with fenced leases.
//!
//! Data flows one way: kernel → [`fuse`] (session, request hook, thin
//! adapter) → [`fs`] (filesystem operations) → [`lease`] (the lease rules)
//! and [`namespace`] (inode table and tree) → [`store`] (journals and
//! snapshots on a state directory). Errors map to errno in exactly one
//! place, [`error::Error::errno`].

pub mod bench;
pub mod cluster;
pub mod control;
pub mod error;
pub mod events;
pub mod failpoints;
pub mod fs;
pub mod fuse;
pub mod lease;
pub mod namespace;
pub mod procfs;
pub mod store;

/// The version reported by the CLI and the control files.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
