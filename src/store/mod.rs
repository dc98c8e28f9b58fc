//! Durability: everything leasefs keeps on its state directory.
//!
//! - [`storage`]: the tiny file-system trait every durable byte goes
//!   through, with a real-directory backend and an in-memory backend that
//!   records what a crash at any moment would leave.
//! - [`epochs`]: the epoch journal (one mount-wide durable ceiling; no epoch
//!   at or below it is ever handed out twice).
//! - [`snapshot`]: the namespace journal and its snapshots (snapshot = temp
//!   file, sync, rename, sync the directory; written off the request path);
//!   [`records`]: their checksummed record codec.
//! - [`group`]: group commit, so a journal sync never runs on the request
//!   path; [`direct`]: large journal writes without the page cache,
//!   written by the sync that needs them.

pub mod direct;
mod encode;
pub mod epochs;
pub mod group;
pub mod records;
pub mod snapshot;
pub mod storage;
