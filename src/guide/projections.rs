//! # Projections: read models fed from the journal
//!
//! The write side is event-sourced entities; the read side is tables built from their events. An
//! entity files its events under tags
//! ([`EventSourced::tags`](crate::persistence::EventSourced::tags)), in the append that stores
//! them, and a [`Projection`](crate::projection::Projection) follows a tag across all entities,
//! from its stored offset, live, handing the events to a handler in batches. The
//! [`projection`](crate::projection) module shows a complete projection into SQLite and states how
//! it runs, fails and refuses to start; this chapter says how to choose and operate one.
//!
//! `examples/projection.rs` in the repository keeps a SQLite table of balances from a bank's
//! accounts, exactly once: `kill -9` it at any moment and run it again; once caught up it checks
//! the table against the journal (`cargo run --example projection`).
//!
//! ## Choosing the commit
//!
//! - **Exactly once into a database**: `exactly_once_sqlite` and `exactly_once_postgres` (feature
//!   `postgres`) hand the handler the database transaction in which the projection then stores
//!   its offset: read-model rows and offset commit together, so after any crash every event is in
//!   the read model exactly once.
//! - **At least once into anything else** (a search index, a cache, another service):
//!   [`at_least_once`](crate::projection::Projection::at_least_once) stores the offset in an
//!   [`OffsetStore`](crate::projection::OffsetStore) after the handler succeeded; after a crash the
//!   events since the stored offset come again, so the handler must be idempotent.
//!
//! ## Why the offset never skips
//!
//! An offset taken from a sequence can skip: transaction A takes 7, B takes 8 and commits first, a
//! reader goes on after 8, and 7 is never seen. On PostgreSQL the offset is the writing
//! transaction's id and then a row number, and a read returns only rows of transactions that have
//! ended before every transaction still open
//! ([`Offset`](crate::journal::Offset) says how). The cost: a transaction left open anywhere on
//! the server holds the live tail back until it ends. SQLite has one writer, so its commit order
//! is the offset.
//!
//! ## Operating a projection
//!
//! The [`projection`](crate::projection) module states how a projection runs: batches, polling
//! and notifications, retries and the [`PoisonPolicy`](crate::projection::PoisonPolicy), and the
//! starts it refuses ([`ProjectionError::Refused`](crate::projection::ProjectionError::Refused):
//! a read model of another journal, an offset beyond the journal, a changed slicing). What to do
//! with it:
//!
//! - **Run one instance per name and slices.** A second instance of an exactly-once projection
//!   costs work, not correctness: the loser's batch rolls back (`conflicts` in the stats).
//! - **Scale out with slices.** N instances with `Slices::split(n, i)` follow disjoint sets of
//!   streams and together the whole tag, each with its own offset. The slices of an exactly-once
//!   projection are fixed: to change them, rebuild.
//! - **Rebuild** a read model by starting the projection under a new name: it starts at offset 0.
//! - **Watch** `stats()` (events, batches, retries, skipped entries, lag); with the `metrics`
//!   feature as `actix_delivery_projection_*`.
//! - **Upgrading.** Journal schema 3 added the tags: what was written before has none. A read
//!   model of the previous release, which recorded no journal id, is checked by its offset alone
//!   and then records its journal. A PostgreSQL read model whose tables were made by hand needs
//!   `projection_journal (projection TEXT PRIMARY KEY, journal_id TEXT NOT NULL)` too.
