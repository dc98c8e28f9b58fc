//! The test bench (SPEC 13): fault rules that tests add to a live mount.
//!
//! This room holds the rules as data and their seeded decisions
//! ([`rules`]), the path globs they match ([`glob`]) and the errno names
//! they may ask for ([`errnos`]). It decides; it never carries an action
//! out: a fired errno goes through the same errno map as a real error, a
//! delay or a hang through the same parked replies as a lock wait.

pub mod door;
pub mod errnos;
pub mod glob;
pub mod guard;
pub mod rules;

pub use door::{Bench, Resume, Then, Wants, ACTIONS};
pub use guard::TestMount;
pub use rules::{Action, Call, Fired, RuleSpec, Rules, OPS};
