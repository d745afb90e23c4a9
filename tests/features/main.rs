//! The in-process suites that a feature changes or needs: the journals (PostgreSQL besides
//! memory and SQLite), PostgreSQL itself, NATS, TLS (the TCP suites run over mutual TLS with
//! `tls`: see `tcp::tls`), tracing, the settings of gated parts, and sharding and schema
//! evolution on PostgreSQL. `cargo test` runs what needs no feature and no server;
//! `cargo test --all-features` runs everything (servers as `tests/README.md` says).
//!
//! Each module was a test binary of its own; `cargo test --test features journal::` runs one.

#[path = "../common/mod.rs"]
mod common;
#[macro_use]
#[path = "../journal_conformance/mod.rs"]
mod journal_conformance;
#[cfg(feature = "nats")]
#[path = "../nats_support/mod.rs"]
mod nats_support;
#[cfg(feature = "postgres")]
#[path = "../postgres_support/mod.rs"]
mod postgres_support;
#[path = "../remote/mod.rs"]
mod remote;

#[cfg(feature = "admin")]
mod admin;
mod chunking;
mod dead_letters;
mod journal;
mod journal_ceiling;
mod journal_identity;
#[cfg(feature = "nats")]
mod nats;
mod options;
#[cfg(feature = "postgres")]
mod postgres;
mod remote_delivery;
mod remote_faults;
mod remote_security;
mod schema_evolution;
mod sharding;
mod skipped_suites;
#[cfg(feature = "tracing")]
mod tracing;
mod version_negotiation;
#[cfg(feature = "nats")]
mod work_pulling_nats;
