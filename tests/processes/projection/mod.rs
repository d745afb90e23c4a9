//! Projections: read models fed from the journal by tag, exactly once and at least once, live,
//! resumable; what they do with failing, deleted and undecodable entries; slices; and, with
//! real processes killed with SIGKILL, exactly-once read models in SQLite and (feature
//! `postgres`) PostgreSQL, the latter with two writer processes committing out of order.
//!
//! - `runner`: the runner over a memory journal, under virtual time.
//! - `sqlite`: exactly once into a SQLite read model, in process.
//! - `crash_sqlite`: the SQLite read model across SIGKILLs of the process that writes and
//!   projects.
//! - `postgres` (feature `postgres`): exactly once into PostgreSQL, and the test with two
//!   writer processes, a projection process killed again and again, and a naive reader that
//!   shows the skip the offset design avoids.

mod bank;
mod crash_sqlite;
#[cfg(feature = "postgres")]
mod postgres;
mod runner;
mod sqlite;
