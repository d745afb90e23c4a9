//! Why a projection stopped, or could not start.

use crate::journal::{Offset, PersistenceId};

/// The error a handler returns: any error (a `rusqlite::Error`, a `tokio_postgres::Error`, a
/// `String`…) converts with `?`. A failing handler is retried; see
/// [`PoisonPolicy`](crate::projection::PoisonPolicy).
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// Why a projection stopped on its own, or a read model could not be opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProjectionError {
    /// With [`PoisonPolicy::Stop`](crate::projection::PoisonPolicy): an entry could not be got
    /// past (its handler kept failing, its events were deleted before the projection read
    /// them, or it does not decode). The stored offset is the one before it: fix the cause
    /// and start the projection again, and it goes on from there.
    #[error(
        "projection `{projection}` stopped at stream `{persistence_id}`, seq {seq} (offset \
         {offset}): {reason}"
    )]
    Poison {
        /// The projection's name.
        projection: String,
        /// The entry's offset in the tag.
        offset: Offset,
        /// Its stream.
        persistence_id: PersistenceId,
        /// Its seq.
        seq: u64,
        /// Why it could not be got past.
        reason: String,
    },
    /// The read model or offset store could not be opened or set up.
    #[error("the read model failed: {0}")]
    Store(String),
    /// The projection's task ended without being stopped (its arbiter or system stopped).
    #[error("the projection's task ended without being stopped")]
    Gone,
}
