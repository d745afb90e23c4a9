//! Projections: read models fed from the journal, exactly once or at least once, live and
//! resumable.
//!
//! Entities file their events under tags ([`EventSourced::tags`](crate::persistence::EventSourced::tags));
//! a [`Projection`] follows one tag across all streams, from its stored offset, and hands the
//! events to a handler in batches. The offset (see [`Offset`](crate::journal::Offset)) never
//! skips an event and never repeats one, also on PostgreSQL with several processes committing
//! out of order; so where the offset is stored decides the guarantee:
//!
//! | start with | the handler gets | the offset is stored | after a crash |
//! |---|---|---|---|
//! | `Projection::exactly_once_sqlite` (feature `sqlite`, on by default) | each batch, with the `rusqlite` transaction | in that transaction, in the read model's file | every event in the read model exactly once |
//! | `Projection::exactly_once_postgres` (feature `postgres`) | each batch, with the `tokio_postgres` transaction | in that transaction | every event in the read model exactly once |
//! | [`Projection::at_least_once`] | each batch | in an [`OffsetStore`] after the handler succeeded, every `commit_every` events or `commit_interval` (and at a stop) | the events after the stored offset again: make the handler idempotent |
//!
//! ```no_run
//! use std::sync::Arc;
//! use actix_delivery::journal::{SqliteJournal, Tag};
//! use actix_delivery::persistence::{Decision, EventSourced};
//! use actix_delivery::projection::{Projection, ProjectionOptions, SqliteReadModel};
//! # #[derive(Default, serde::Serialize, serde::Deserialize)] struct Account { balance: i64 }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Deposited(i64);
//! # impl EventSourced for Account {
//! #     type Command = i64; type Event = Deposited; type Reply = (); type Rejection = String;
//! #     fn decide(&self, n: &i64) -> Result<Decision<Self>, String> { Ok(Decision::persist([Deposited(*n)], ())) }
//! #     fn apply(&mut self, Deposited(n): &Deposited) { self.balance += n; }
//! #     fn tags(_: &Deposited) -> Vec<Tag> { vec![Tag::from_static("account")] }
//! # }
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let journal = Arc::new(SqliteJournal::open("bank.journal").await?);
//! let mut model = SqliteReadModel::open("bank-read-model.db").await?;
//! model
//!     .execute_batch("CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, balance INTEGER)")
//!     .await?;
//! let options = ProjectionOptions::builder("balances", Tag::from_static("account")).build()?;
//! let projection = Projection::of::<Account>(journal, options).exactly_once_sqlite(
//!     model,
//!     |transaction, events| {
//!         for envelope in events {
//!             transaction.execute(
//!                 "INSERT INTO balances VALUES (?1, ?2) \
//!                  ON CONFLICT (account) DO UPDATE SET balance = balance + ?2",
//!                 rusqlite::params![envelope.persistence_id.as_str(), envelope.event.0],
//!             )?;
//!         }
//!         Ok(()) // the projection stores its offset in this transaction, then commits
//!     },
//! );
//! // … later: finish the batch in flight and stop.
//! projection.stop();
//! projection.stopped().await?;
//! # Ok(()) }
//! ```
//!
//! # How it runs
//!
//! - **Resumes** from the offset stored under its name and slices; a new name starts from
//!   offset 0, which rebuilds a read model from the whole journal.
//! - **Batches** of whole entries (an entry holds the events of one command, and its events
//!   never split), at most `batch_size` events, one batch at a time, in offset order.
//! - **Live:** after a read that found nothing new it waits `poll_interval`, doubling up to
//!   `max_poll_interval`; the journal's [notifications](crate::journal::Journal::tag_notifications)
//!   wake it at once (SQLite and memory journals: as their writer commits; PostgreSQL: through
//!   `LISTEN/NOTIFY`, for the commits of every process).
//! - **Failures:** a failing batch is retried after a doubling wait, `max_retries` times, then
//!   each of its entries alone; an entry that still fails alone, whose events were deleted
//!   before the projection read them (a snapshot with `delete_events_on_snapshot`), or that
//!   does not decode, goes to the [`PoisonPolicy`]: stop there (the default; the stored
//!   offset stays before it and [`ProjectionHandle::stopped`] names it), or skip it, counted
//!   and logged. A failure of the read model itself is no fault of the events: a lost
//!   connection, a full disk, a commit whose answer was lost or did not come within the
//!   timeout (`PostgresReadModel::with_timeout`), and also a table or column that is not
//!   there, a syntax error or a missing privilege (the read model's schema or the handler's
//!   SQL). Then the projection loads its offset again, which says whether the last commit
//!   went through, and goes on from there, retrying for as long as it takes (counted as
//!   `store_failures`), so a broken read model never makes `Skip` skip events. A failing
//!   read of the journal is retried the same way, unless no retry can mend it (corrupt or
//!   incompatible data, a journal that cannot read by tag): then it stops with
//!   [`ProjectionError::Journal`].
//! - **A handler keeps to its transaction:** one that ends it (a `COMMIT` or `ROLLBACK` of
//!   its own) or returns `Ok` after one of its statements failed has its batch counted as
//!   failed, and the offset is not stored; what it committed on its own is beyond the
//!   projection's reach.
//! - **One instance per name and slices:** with exactly once, a batch stores its offset only
//!   if the stored one is still the one it started from. A second instance running by
//!   mistake (or an old one not yet gone) therefore never applies a batch twice: the loser's
//!   transaction rolls back, it loads the offset again (counted as `conflicts`), and the two
//!   only waste each other's work.
//! - **Refused starts:** an exactly-once projection whose read model holds offsets of the
//!   same name under other, overlapping slices (the slicing changed: the events behind them
//!   would be handled again), and any projection whose stored offset is beyond everything
//!   the journal has committed ([`Journal::offset_ceiling`](crate::journal::Journal::offset_ceiling):
//!   a journal reset or restored from a logical dump, or another journal) or whose read model
//!   follows another journal, stop at once with [`ProjectionError::Refused`] instead of
//!   handling events twice or skipping new ones. The read model records the
//!   [journal's id](crate::journal::Journal::journal_id) at the projection's first start
//!   (in `projection_journal`; an [`OffsetStore`] through [`OffsetStore::follow`]), once its
//!   offset passed the ceiling (a refused start records nothing), and compares it at every
//!   start: an offset of another journal can lie within this one's, where no ceiling shows
//!   it. To change the slices or the journal, rebuild: under a new name, or after deleting
//!   the name's rows from `projection_offset` and `projection_journal` together with what the
//!   projection wrote.
//! - **Stats:** [`ProjectionHandle::stats`] (events, entries, batches, retries, skipped,
//!   offsets stored, failures of the journal and of the store, conflicts, lag, offset); with the
//!   `metrics` feature also as `actix_delivery_projection_*` metrics.
//!
//! It runs as a task on the arbiter that started it; the SQLite handler runs on Tokio's
//! blocking threads (so `D::Event` must be `Send + Sync` there).

mod at_least_once;
use actix_delivery_proto::projection::core;
use actix_delivery_proto::projection::envelope;
use actix_delivery_proto::projection::error;
mod handle;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
use actix_delivery_proto::projection::options;
#[cfg(feature = "postgres")]
mod postgres;
mod runner;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use self::core::ProjectionStats;
pub use at_least_once::{HandlerFuture, MemoryOffsetStore, OffsetStore};
pub use envelope::{EntityEvents, Envelope, EventDecoder, RawEvents};
pub use error::{HandlerError, ProjectionError};
pub use handle::ProjectionHandle;
pub use options::{PoisonPolicy, ProjectionOptions, ProjectionOptionsBuilder, MAX_PROJECTION_NAME};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresReadModel;
pub use runner::Projection;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteReadModel;
