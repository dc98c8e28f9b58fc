//! The multi-host lease authority's connection to etcd: a synchronous
//! client of etcd's v3 JSON gateway ([`client`]) over a minimal HTTP/1.1
//! transport ([`http`]), the host session with its jeopardy deadline
//! ([`session`]) and cluster-wide arbitration with epochs ([`arbiter`]).

pub mod arbiter;
pub mod b64;
pub mod client;
pub mod http;
pub mod session;
