//! The multi-host lease authority's connection to etcd: a synchronous
//! client of etcd's v3 JSON gateway ([`client`]) over a minimal HTTP/1.1
//! transport ([`http`]).

pub mod b64;
pub mod client;
pub mod http;
