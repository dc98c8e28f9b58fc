//! Integration tests: real leasefs mounts driven from separate processes.
//!
//! They mount filesystems and must run as root (CI does). Each test mounts
//! its own filesystem in a temp dir; the mount guard unmounts even when the
//! test panics.

mod util;

mod caching;
mod cas;
mod cli;
mod clients;
mod compat;
mod conformance;
mod control;
mod differential;
mod docs;
mod durability;
mod etcd;
mod events;
mod examples;
mod faults;
mod fencing;
mod hosts;
mod limits;
mod lock_tree;
mod locks;
mod operate;
mod posix;
mod power;
mod top;
mod transport;
