//! Why a projection stopped, or could not start.

use crate::journal::by_tag::Offset;

use crate::journal::error::JournalError;

use crate::journal::id::PersistenceId;

/// The error a handler returns: any error (a `rusqlite::Error`, a `tokio_postgres::Error`, a
/// `String`…) converts with `?`. A failing handler is retried; see
/// [`PoisonPolicy`](crate::projection::options::PoisonPolicy).
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// Why a projection stopped on its own, or a read model could not be opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProjectionError {
    /// With [`PoisonPolicy::Stop`](crate::projection::options::PoisonPolicy): an entry could not be got
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
    /// The read model does not fit this projection, which therefore handles nothing: it has
    /// offsets of the same name under other slices (a change of slicing, which would handle
    /// their events again: rebuild instead, under a new name or after deleting the name's
    /// rows from `projection_offset` and `projection_journal`), its stored offset is beyond
    /// everything the journal has committed (the journal was reset or restored, or the
    /// offset is another journal's: every new entry would be skipped), or it follows another
    /// journal (see `Journal::journal_id`; the reason
    /// names both ids).
    #[error("projection `{projection}` cannot start: {reason}")]
    Refused {
        /// The projection's name.
        projection: String,
        /// What does not fit, and what to do.
        reason: String,
    },
    /// Reading the journal failed in a way no retry mends (corrupt or incompatible data, a
    /// journal that cannot read by tag). Failures of the storage itself are retried.
    #[error("projection `{projection}` cannot read the journal: {error}")]
    Journal {
        /// The projection's name.
        projection: String,
        /// The journal's error.
        error: JournalError,
    },
    /// The read model or offset store could not be opened or set up.
    #[error("the read model failed: {0}")]
    Store(String),
    /// The projection's task ended without being stopped (its arbiter or system stopped).
    #[error("the projection's task ended without being stopped")]
    Gone,
}
