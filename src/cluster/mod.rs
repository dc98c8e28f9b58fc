//! Several hosts through etcd (SPEC 10): a synchronous client of etcd's v3
//! JSON gateway ([`client`]) over a minimal HTTP/1.1 transport ([`http`]),
//! the host session with its jeopardy deadline ([`session`]), cluster-wide
//! arbitration with epochs ([`arbiter`]), the host's one watch over every
//! lease queue ([`watcher`]), the shared namespace ([`namespace`]) with its
//! one watch ([`feed`]), and the
//! arbitration a mount with `--etcd` adds to its lease table
//! ([`authority`]). It plugs into `lease/` through
//! [`crate::lease::arbitration::Arbitration`] (who decides a grant and its
//! epoch) and into `namespace/` through its replica seam (where a change
//! is stored).

pub mod arbiter;
pub mod authority;
pub mod b64;
pub mod client;
pub mod entries;
pub mod feed;
pub mod http;
pub mod namespace;
pub mod session;
pub mod watcher;
