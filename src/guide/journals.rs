//! # Journals: where everything durable is stored
//!
//! Durable producers, persistent entities, projections and sharding all store through one trait,
//! [`Journal`](crate::journal::Journal): streams of events named by a
//! [`PersistenceId`](crate::journal::PersistenceId) (1 to 256 bytes of UTF-8, no NUL), numbered
//! 1, 2, 3, … without gaps, plus one current snapshot per stream. An append resolves `Ok` only
//! once it is committed, and only if it continues its stream exactly: a second writer gets
//! [`JournalError::Conflict`](crate::journal::JournalError::Conflict) and writes nothing, so
//! duplicate actors and split brains are harmless. The [`journal`](crate::journal) module states
//! the contract and its edge cases.
//!
//! | journal | feature | for |
//! |---|---|---|
//! | `SqliteJournal` | `sqlite` (on by default) | one process: an embedded file, no server |
//! | `PostgresJournal` | `postgres` | several processes or nodes sharing one database |
//! | [`MemoryJournal`](crate::journal::MemoryJournal) | none | tests: the same semantics in memory, with fault injection |
//!
//! Each commits every append that arrived while the previous commit ran in one transaction
//! (group commit: many appends, from many streams, per fsync), behind a bounded queue. What that
//! buys is measured in `benches/README.md`.
//!
//! ## SQLite
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # #[actix::main] async fn main() -> Result<(), actix_delivery::journal::JournalError> {
//! # let event_bytes = b"created".to_vec();
//! use actix_delivery::journal::{Journal, PersistenceId, SqliteJournal};
//!
//! let journal = SqliteJournal::open("orders.journal").await?; // created on first open
//! let id = PersistenceId::new("order-4711")?;
//! let next = journal.highest_seq(&id).await? + 1;
//! journal.append(&id, next, vec![event_bytes]).await?; // Ok = on disk
//! journal.backup("orders.backup").await?; // a consistent copy while appends go on
//! journal.close().await; // or drop the last handle
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))] fn main() {}
//! ```
//!
//! One file (plus `-wal`, `-shm` and `-lock`) in WAL mode with `synchronous=FULL`, open in one
//! journal at a time across processes. **Do not copy the files of a live journal**: the newest
//! commits are in the `-wal` file, and a copy can silently lack acknowledged events. Use
//! `SqliteJournal::backup`, or copy the files with the journal closed.
//! The tables are the ones Akka Persistence users know (`event_journal`, `snapshot`,
//! `stream_metadata`, `event_tag`, `journal_identity`), inspectable with `sqlite3`.
//!
//! ## PostgreSQL (feature `postgres`)
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use actix_delivery::journal::{PostgresJournal, PostgresOptions};
//!
//! let journal = PostgresJournal::connect_with(
//!     "host=db.internal user=orders dbname=orders", // libpq key=value, or a postgresql:// URL
//!     PostgresOptions::builder().schema("journal").build()?, // default: public
//! )
//! .await?; // creates the tables on first connect
//! # drop(journal); Ok(()) }
//! # #[cfg(not(feature = "postgres"))] fn main() {}
//! ```
//!
//! - **Tables and privileges.** The journal creates its tables on first connect (under an
//!   advisory lock, so nodes starting together create them once), or a DBA does from
//!   `PostgresJournal::SCHEMA_SQL` and the journal runs with `create_tables(false)` and only
//!   `SELECT, INSERT, UPDATE, DELETE` (and `USAGE` on `event_tag`'s sequence). Every connect
//!   checks the schema's version: an older one is migrated (PostgreSQL 13 or newer), a newer or
//!   foreign one is refused and left untouched.
//! - **TLS** (features `postgres` and `tls`): `PostgresOptionsBuilder::tls` with
//!   `PostgresTls::verify_full(ca_pem)` (the certificate checked against the CA and the host
//!   name) or `PostgresTls::require()` (encrypted, not checked). The connection string's
//!   `sslmode` is not where this is chosen; client certificates are not offered. Without `tls`,
//!   connections are unencrypted: use a trusted network or a Unix socket.
//! - **Lost connections** while a commit is in flight fail its appends with a `Storage` error
//!   that says the write *may or may not* be stored; a persistent entity or durable producer then
//!   re-reads its stream. Nothing is reported `Ok` that PostgreSQL did not confirm.
//! - **Refused before sending, not lost in flight.** PostgreSQL drops a connection on a protocol
//!   message over 1 GiB, which would leave the outcome unknown: an append that would need one is
//!   refused with `InvalidArgument` before anything is sent. Tables altered by hand (a column
//!   dropped, renamed or retyped, a table missing) are `JournalError::Schema` with the server's
//!   message, on connect and while running, never a transient error a supervisor would retry
//!   forever.
//! - **No connection pool**: the journal needs one dedicated writer connection and a fixed pair
//!   of read connections, each pipelining any number of reads, and runs their I/O on a thread of
//!   its own, so its futures work on any runtime (an Actix arbiter, a `#[tokio::test]`).
//!
//! Errors of both journals say why: a PostgreSQL error carries the server's message, detail and
//! SQLSTATE, a SQLite error its result code. Journals of earlier releases are migrated on open:
//! [Changing your types](super::schema_evolution#journals-of-earlier-releases).
