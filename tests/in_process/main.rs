//! The in-process suites that no feature changes: the actors under virtual time, durable
//! producers, persistence, outboxes, work pulling, and the seeded simulators of the pure
//! cores. One test binary for all of them (one link, one copy of what they share):
//! `cargo test --all-features` would run them exactly as `cargo test` does, so CI builds them
//! once, with the default features.
//!
//! Each module was a test binary of its own; `cargo test --test in_process durable::` runs
//! one (see `tests/README.md`).

#[path = "../common/mod.rs"]
mod common;

mod actor_chaos;
mod arbiters;
mod concurrent_writers;
mod consumer;
mod dead_letters;
mod delivery_record;
mod durable;
mod durable_chaos;
mod durable_recovery;
mod durable_settlement;
mod durable_stop;
mod outbox;
mod persistence_limits;
mod persistent;
mod producer;
mod shutdown;
mod work_pulling;
mod wrap_actor;
