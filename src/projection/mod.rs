//! Projections: read models fed from the journal.
#![allow(missing_docs, dead_code)]

mod at_least_once;
mod core;
mod envelope;
mod error;
mod handle;
mod options;
#[cfg(feature = "postgres")]
mod postgres;
mod runner;
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
pub use sqlite::SqliteReadModel;
