//! The multi-host lease authority's connection to etcd: a synchronous
//! client of etcd's v3 JSON gateway ([`client`]) over a minimal HTTP/1.1
//! transport ([`http`]), the host session with its jeopardy deadline
//! ([`session`]), cluster-wide arbitration with epochs ([`arbiter`]), and
//! the lease authority a mount with `--etcd` asks ([`authority`]).

pub mod arbiter;
pub mod authority;
pub mod b64;
pub mod client;
pub mod http;
pub mod namespace;
pub mod session;
pub mod watcher;
