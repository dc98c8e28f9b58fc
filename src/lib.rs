//! leasefs: a FUSE filesystem that turns a mounted directory into a lock
//! service with fenced leases.
//!
//! Data flows one way: kernel → [`session`] (mount and request hook) →
//! [`fuse`] (thin adapter) → [`fs`] (filesystem operations) → [`namespace`]
//! (inode table and tree). Errors map to errno in exactly one place,
//! [`error::Error::errno`].

pub mod control;
pub mod error;
pub mod fs;
pub mod fuse;
pub mod group;
pub mod lease;
pub mod namespace;
pub mod observe;
pub mod persist;
pub mod session;
pub mod storage;
pub mod store;

/// The version reported by the CLI and the control files.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
