//! The lease rules: everything SPEC sections 4 to 7 call lease behaviour.
//!
//! - [`machine`]: the pure state machine of holders, waiters, epochs, TTLs
//!   and fences (no I/O, no clock, no fuser types; it returns effects).
//! - [`observe`]: what each process last observed of each lease, and the
//!   compare-and-swap verdicts drawn from it; [`views`]: the bookkeeping
//!   around it (process identity, name history).
//! - [`floors`]: the lowest epoch each path may carry and the durable
//!   ceiling above every epoch handed out.
//! - [`authority`]: the one type the filesystem core asks every lease
//!   question through; [`local`]: the lease table it keeps on every host;
//!   [`arbitration`]: what several hosts decide together (implemented in
//!   `cluster/`), the only difference between one host and several.

pub mod arbitration;
pub mod authority;
pub mod floors;
pub mod local;
pub mod machine;
pub mod observe;
pub mod rows;
pub mod seam;
pub mod views;

pub use machine::*;
