//! The tests that run real processes and kill them: this test binary re-runs itself as the
//! children (`process::spawn` names the child's test by its path here), SIGKILLs them at
//! seeded moments and checks what survived. Beside them, the in-process tests of projections,
//! which share the crash tests' read models. CI runs this binary in a release build too,
//! where the kills land at other moments than in a debug build (`.ci/run`,
//! `tests/README.md`); an in-process test belongs in `features` or `in_process`, which it
//! builds unoptimized.
//!
//! Each module was a test binary of its own; `cargo test --test processes journal_crash::`
//! runs one.

#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "nats")]
#[path = "../nats_support/mod.rs"]
mod nats_support;
#[cfg(feature = "postgres")]
#[path = "../postgres_support/mod.rs"]
mod postgres_support;
#[path = "../process/mod.rs"]
mod process;
#[path = "../remote/mod.rs"]
mod remote;

mod actix_web;
mod chunking_crash;
mod dead_letter_replay_crash;
#[cfg(feature = "postgres")]
mod durable_lease;
mod end_to_end_crash;
mod journal_crash;
#[cfg(all(feature = "nats", feature = "postgres"))]
mod nats_failover;
mod outbox_crash;
mod persistent_crash;
#[cfg(feature = "postgres")]
mod postgres_nodes;
mod projection;
mod remote_crash;
#[cfg(all(feature = "nats", feature = "postgres"))]
mod sharding_crash;
#[cfg(feature = "postgres")]
mod work_pulling_crash;
mod work_pulling_give_up_crash;
